"""Schedules: how late after its time a tick is published, and whether each is published
once, with N ``runconsumer`` processes evaluating one every-second schedule.

    python -m bench.schedules [--processes 3] [--seconds 30] [--url mysql://...]

The delay of a tick is ``created_at`` (the database clock, at the INSERT) minus the tick's
time; a process looks at a schedule only when its next tick is due, so the delay is the
time to wake up, claim and insert, not a polling interval.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.beats"
DEFAULT_URL = "mysql://root@127.0.0.1:3306/sqlqueue_bench"


def start(count: int, url: str) -> list[subprocess.Popen[bytes]]:
    settings = {"SCHEDULES": {"beat": {"topic": TOPIC, "every": 1, "catch_up": 5}}}
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "BENCH_DATABASE_URL": url,
           "BENCH_SQLQUEUE_JSON": json.dumps(settings)}
    return [subprocess.Popen([sys.executable, "-m", "django", "runconsumer", "--group", "soak",
                              "--name", f"beat-{n}", "-v", "0"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for n in range(count)]


def measure(seconds: int) -> dict[str, float]:
    from sqlqueue.models import QueueMessage, ScheduleState

    rows = list(QueueMessage.objects.filter(topic=TOPIC).values_list("metadata", "created_at"))
    ticks = [datetime.fromisoformat(m["tick"]).timestamp() * 1000 for m, _ in rows]
    delays = sorted(created - tick for (_, created), tick in zip(rows, ticks, strict=True))
    first, last = min(ticks), max(ticks)
    expected = round((last - first) / 1000) + 1
    ScheduleState.objects.all().delete()
    return {
        "ticks": len(ticks), "distinct": len(set(ticks)), "expected": expected,
        "delay_p50_ms": statistics.median(delays),
        "delay_p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
        "delay_max_ms": delays[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    options = parser.parse_args()
    setup(options.url)
    reset()
    from sqlqueue.models import ScheduleState

    ScheduleState.objects.all().delete()
    processes = start(options.processes, options.url)
    try:
        time.sleep(options.seconds + 2)  # a benchmark's run time, not a test's wait
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)
    result = measure(options.seconds)
    print(json.dumps({"processes": options.processes, **result}, indent=2))


if __name__ == "__main__":
    main()
