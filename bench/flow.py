"""Flow control figures (#17): rate-limit accuracy, and draining with ``--processes``.

    .venv/bin/python -m bench.flow rate --processes 1 --rate 100
    .venv/bin/python -m bench.flow rate --processes 3 --rate 100
    .venv/bin/python -m bench.flow drain --processes 2       # --processes 2 vs two commands

``rate``: a backlog on 12 partitions, P ``runconsumer`` processes of a consumer with
``rate_limit``; the starts are counted over ``--window`` seconds once ``--warm-up`` seconds
have passed (the processes split the partitions meanwhile). ``drain``: the same pre-loaded
messages drained by one ``runconsumer --processes P --until-empty`` and by P separate
``runconsumer --until-empty`` commands (start-up included in both), best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import reset, setup
from bench.drain import ROOT, drain, preload

#: quick lease ticks, so that the processes share the partitions within a few seconds
SHORT_LEASES = {"LEASE_DURATION": 6, "LEASE_RENEW_INTERVAL": 2}


def rate(url: str, processes: int, limit: float, warm_up: float, window: float) -> dict:
    from django.db import transaction

    from sqlqueue import OutgoingMessage, send_messages

    reset()
    total = round(limit * (warm_up + window + 10))
    for first in range(0, total, 1000):
        with transaction.atomic():
            send_messages("bench.rate", [OutgoingMessage({}, partition_key=f"p{n % 12}")
                                         for n in range(first, min(first + 1000, total))])
    journal = Path(tempfile.mkstemp(prefix="bench-rate-")[1])
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "BENCH_DATABASE_URL": url,
           "BENCH_RATE_LIMIT": str(limit), "BENCH_RATE_JOURNAL": str(journal),
           "BENCH_SQLQUEUE_JSON": json.dumps(SHORT_LEASES)}
    argv = [sys.executable, "-m", "django", "runconsumer", "--group", "bench-rate", "-v", "0"]
    started = time.monotonic()
    workers = [subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(processes)]
    try:
        time.sleep(warm_up + window + 1)  # a benchmark, not a test: fixed phases
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)
    starts = [float(line) for line in journal.read_text().split()]
    journal.unlink()
    since = started + warm_up
    counted = sum(1 for at in starts if since <= at < since + window)
    measured = counted / window
    reset()
    return {"scenario": "rate", "processes": processes, "rate_limit": limit,
            "window_s": window, "measured_per_s": round(measured, 2),
            "error_percent": round(100 * (measured - limit) / limit, 2)}


def drain_supervised(group: str, processes: int, batch: int, url: str) -> float:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url, "BENCH_BATCH": str(batch)}
    argv = [sys.executable, "-m", "django", "runconsumer", "--group", group, "--until-empty",
            "--processes", str(processes), "-v", "0"]
    started = time.perf_counter()
    code = subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode
    if code:
        raise SystemExit(f"runconsumer --processes failed: exit code {code}")
    return time.perf_counter() - started


def compare_drains(url: str, processes: int, messages: int, rounds: int) -> dict:
    best: dict[str, float] = {}
    for _ in range(rounds):
        for how, run in (("separate_commands", drain), ("supervisor", drain_supervised)):
            reset()
            preload(messages, 16)
            elapsed = run("bench-unordered", processes, 100, url)
            best[how] = min(best.get(how, elapsed), elapsed)
    reset()
    return {"scenario": "drain", "messages": messages, "processes": processes,
            **{f"{how}_per_s": round(messages / s) for how, s in best.items()},
            "note": "best of rounds; process start-up included"}


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue flow control benchmark")
    parser.add_argument("scenario", choices=["rate", "drain"])
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--warm-up", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup(args.url)
    if args.scenario == "rate":
        result = rate(args.url, args.processes, args.rate, args.warm_up, args.window)
    else:
        result = compare_drains(args.url, args.processes, args.messages, args.rounds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
