"""Live traffic beside a long operation (bench.scale: garbage collection of a backlog):
a steady publisher and a ``runconsumer`` of its own group, and the publish-to-handled
latency of each message (the handler writes it, ``bench.consumers.live``).

    with LiveTraffic(url, rate=50) as live:
        live.mark("quiet"); time.sleep(20)
        live.mark("gc"); run_gc()
    live.summary()  # {"quiet": {"p50_ms": .., "p99_ms": .., "n": ..}, "gc": {...}}
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.consumers import LIVE_FILE_VARIABLE, LIVE_TOPIC

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1) if ordered else None


class LiveTraffic:
    """``rate`` messages a second (one ``send_message`` each, its own transaction) to
    ``LIVE_TOPIC`` over 16 partitions, handled by one ``runconsumer`` process."""

    def __init__(self, url: str, rate: float = 50.0) -> None:
        self.url = url
        self.rate = rate
        self.journal = Path(tempfile.mkstemp(prefix="sqlqueue-live-", suffix=".txt")[1])
        self.phases: list[tuple[float, str]] = []  # (time.time() it began, name)
        self.publish_ms: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._consumer: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiveTraffic:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
               "BENCH_DATABASE_URL": self.url, LIVE_FILE_VARIABLE: str(self.journal)}
        self._consumer = subprocess.Popen(
            [sys.executable, "-m", "django", "runconsumer", "--group", "bench-scale-live",
             "-v", "0"], cwd=ROOT, env=env)
        self.mark("warm-up")
        self._thread.start()
        self._wait_for_handled(20, timeout=120)
        return self

    def mark(self, phase: str) -> None:
        """What follows belongs to ``phase`` (by the time each message was sent)."""
        self.phases.append((time.time(), phase))

    def _publish(self) -> None:
        from django.db import connection

        from sqlqueue import send_message

        n = 0
        started = time.perf_counter()
        while not self._stop.is_set():
            n += 1
            sent = time.time()
            send_message(LIVE_TOPIC, {"t": sent, "n": n}, partition_key=f"p{n % 16}")
            self.publish_ms.append((sent, (time.time() - sent) * 1000))
            delay = started + n / self.rate - time.perf_counter()
            if delay > 0:
                self._stop.wait(delay)
        connection.close()

    def _wait_for_handled(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self._lines()) < count:
            if time.monotonic() > deadline:
                raise SystemExit("the live consumer handled nothing")
            time.sleep(0.2)

    def _lines(self) -> list[tuple[float, float]]:
        rows = []
        for line in self.journal.read_text().splitlines():
            handled, latency = line.split()
            rows.append((float(handled) - float(latency) / 1000, float(latency)))
        return rows

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        time.sleep(3)  # the last messages handled
        if self._consumer is not None:
            self._consumer.terminate()
            self._consumer.wait(timeout=60)

    def _phase_of(self, sent: float) -> str:
        name = self.phases[0][1]
        for began, phase in self.phases:
            if sent >= began:
                name = phase
        return name

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per phase: messages, publish-to-handled p50/p99/max (ms), publish p99 (ms)."""
        handled: dict[str, list[float]] = {}
        for sent, latency in self._lines():
            handled.setdefault(self._phase_of(sent), []).append(latency)
        published: dict[str, list[float]] = {}
        for sent, took in self.publish_ms:
            published.setdefault(self._phase_of(sent), []).append(took)
        return {phase: {"n": len(values), "p50_ms": percentile(values, 0.5),
                        "p99_ms": percentile(values, 0.99), "max_ms": round(max(values), 1),
                        "publish_p99_ms": percentile(published.get(phase, []), 0.99)}
                for phase, values in handled.items() if phase != "warm-up"}
