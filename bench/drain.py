"""Drain rate: N pre-loaded messages, a no-op handler, P runconsumer processes.

    .venv/bin/python -m bench.drain                       # 20,000 messages, 16 partitions
    .venv/bin/python -m bench.drain --processes 1 --group bench-ordered --batch 10
    .venv/bin/python -m bench.drain --messages 100000 --processes 2 --group bench-batch

Several processes share the partitions through leases (start-up included in the time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent


def preload(count: int, partitions: int) -> None:
    from django.db import transaction

    from bench.consumers import TOPIC
    from sqlqueue import OutgoingMessage, send_messages

    for first in range(0, count, 1000):
        with transaction.atomic():
            send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"p{n % partitions}")
                                  for n in range(first, min(first + 1000, count))])


def drain(group: str, processes: int, batch: int, url: str) -> float:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url, "BENCH_BATCH": str(batch)}
    argv = [sys.executable, "-m", "django", "runconsumer", "--group", group, "--until-empty",
            "-v", "0"]
    started = time.perf_counter()
    workers = [subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(processes)]
    codes = [w.wait() for w in workers]
    elapsed = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"runconsumer failed: exit codes {codes}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue drain benchmark")
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--group", default="bench-unordered",
                        choices=["bench-unordered", "bench-ordered", "bench-batch"])
    args = parser.parse_args()
    setup(args.url)
    reset()
    preload(args.messages, args.partitions)
    elapsed = drain(args.group, args.processes, args.batch, args.url)
    print(json.dumps({
        "messages": args.messages, "partitions": args.partitions, "group": args.group,
        "processes": args.processes, "batch": args.batch,
        "seconds": round(elapsed, 2), "messages_per_s": round(args.messages / elapsed),
        "note": "includes process start-up (Django setup, migrations check)",
    }, indent=2))
    reset()


if __name__ == "__main__":
    main()
