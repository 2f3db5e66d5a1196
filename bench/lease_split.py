"""Scale: how long N runconsumer processes take to split P partitions fairly.

    .venv/bin/python -m bench.lease_split              # 1,000 partitions, 10 processes
    .venv/bin/python -m bench.lease_split --partitions 200 --subscribers 4
    .venv/bin/python -m bench.lease_split \
        --settings '{"LEASE_RENEW_INTERVAL": 2, "LEASE_DURATION": 8}'

One message in each partition, scheduled an hour ahead, so the partitions exist and
nothing is handled: what is measured is lease traffic only. The processes start together
(with the default settings unless ``--settings`` says otherwise); the leases table is read
every 50 ms. Reported, in seconds from the start: when every subscriber had its first
heartbeat, when every partition was leased, and when the split became fair (each holds
floor or ceil of P/N). Then one process stops (SIGTERM) and the time until the others
split its partitions fairly is reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import reset, setup

ROOT = Path(__file__).resolve().parent.parent
GROUP = "bench-unordered"
POLL = 0.05


def publish_one_per_partition(partitions: int) -> None:
    from django.db import transaction

    from bench.consumers import TOPIC
    from sqlqueue import OutgoingMessage, send_messages

    with transaction.atomic():
        send_messages(TOPIC, [OutgoingMessage({}, partition_key=f"p{n:05d}",
                                              delay=timedelta(hours=1))
                              for n in range(partitions)])


def holdings() -> tuple[int, list[int]]:
    """(live subscribers, partitions held per holder, largest first)."""
    from sqlqueue.models import PartitionLease, SubscriberHeartbeat

    live = SubscriberHeartbeat.objects.filter(consumer_group=GROUP,
                                              deregistered_at=0).count()
    held = Counter(PartitionLease.objects.filter(consumer_group=GROUP)
                   .exclude(leased_by="").values_list("leased_by", flat=True))
    return live, sorted(held.values(), reverse=True)


def is_fair(held: list[int], partitions: int, subscribers: int) -> bool:
    low, high = partitions // subscribers, -(-partitions // subscribers)
    return (len(held) == subscribers and sum(held) == partitions
            and all(low <= h <= high for h in held))


def wait_until(condition: Callable[[], bool], started: float, limit: float) -> float | None:
    """Seconds from ``started`` until ``condition`` held; None after ``limit`` seconds."""
    while not condition():
        if time.monotonic() - started > limit:
            return None
        time.sleep(POLL)
    return round(time.monotonic() - started, 2)


def start(subscribers: int, url: str, settings: dict[str, Any]) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url, "BENCH_SQLQUEUE_JSON": json.dumps(settings)}
    return [subprocess.Popen([sys.executable, "-m", "django", "runconsumer", "--group", GROUP,
                              "--name", f"split-{n:02d}", "-v", "0"], cwd=ROOT, env=env)
            for n in range(subscribers)]


def measure(partitions: int, subscribers: int, url: str, settings: dict[str, Any],
            limit: float) -> dict[str, Any]:
    workers = start(subscribers, url, settings)
    started = time.monotonic()
    try:
        result: dict[str, Any] = {
            "all_live_s": wait_until(lambda: holdings()[0] == subscribers, started, limit),
            "all_leased_s": wait_until(lambda: sum(holdings()[1]) == partitions, started,
                                       limit),
            "fair_split_s": wait_until(
                lambda: is_fair(holdings()[1], partitions, subscribers), started, limit),
        }
        workers[-1].send_signal(signal.SIGTERM)
        left = time.monotonic()
        result["one_left_fair_again_s"] = wait_until(
            lambda: is_fair(holdings()[1], partitions, subscribers - 1), left, limit)
        return result
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--settings", default="{}", help="SQLQUEUE overrides, as JSON")
    parser.add_argument("--limit", type=float, default=180, help="give up after (seconds)")
    args = parser.parse_args()
    settings = json.loads(args.settings)
    setup(args.url)
    reset()
    publish_one_per_partition(args.partitions)
    from sqlqueue.conf import get_settings

    conf = get_settings()
    result = measure(args.partitions, args.subscribers, args.url, settings, args.limit)
    print(json.dumps({
        "partitions": args.partitions, "subscribers": args.subscribers,
        "lease_duration_s": settings.get("LEASE_DURATION", conf.LEASE_DURATION),
        "lease_renew_interval_s": settings.get("LEASE_RENEW_INTERVAL",
                                               conf.LEASE_RENEW_INTERVAL),
        **result,
        "note": "seconds from starting the processes (interpreter and Django start-up "
                "included); the last from the SIGTERM of one of them",
    }, indent=2))
    reset()


if __name__ == "__main__":
    main()
