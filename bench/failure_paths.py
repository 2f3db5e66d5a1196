"""Failure paths beside the ack path (issue 56): the same N messages drained by three
groups with 2 ``runconsumer`` processes each, in one run: acked (a no-op handler),
rejected (every message dead-lettered at its first attempt), and failing twice then acked
(``max_attempts=3``, 1 ms backoff); then the replay of the N dead letters
(``queue dead-letters replay --all``, run in-process: a keyset walk of the dead-letter
topic, ``REPLAY_CHUNK`` a transaction).

    .venv/bin/python -m bench.failure_paths --url mysql://root@127.0.0.1:3306/sqlqueue_bench
    .venv/bin/python -m bench.failure_paths --url postgres://postgres@127.0.0.1:5432/sqlqueue_bench

The groups drain one after the other, ``--rounds`` times interleaved (ack, reject, twice,
ack, ...: each round on a fresh log), so that a machine loaded by something else weighs on
each alike; the report gives each round and the medians. Times include process start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench.common import reset, setup
from bench.drain import drain

GROUPS = {"ack": "bench-fail-ack", "reject": "bench-fail-reject", "twice": "bench-fail-twice"}


def preload(count: int, partitions: int) -> None:
    from django.db import transaction

    from bench.consumers import FAILURE_TOPIC
    from sqlqueue import OutgoingMessage, send_messages

    for first in range(0, count, 5000):
        with transaction.atomic():
            send_messages(FAILURE_TOPIC, [
                OutgoingMessage({"n": n}, partition_key=f"p{n % partitions}")
                for n in range(first, min(first + 5000, count))])


def replay_all(messages: int) -> tuple[int, float]:
    """Replay every dead letter of the run as an operator would
    (``queue dead-letters replay --all --at-most N``): (how many, seconds)."""
    import io

    from django.core.management import call_command

    from sqlqueue.models import DeadLetter

    before = DeadLetter.objects.count()
    started = time.perf_counter()
    call_command("queue", "dead-letters", "replay", "--all", "--at-most", str(messages),
                 stdout=io.StringIO())
    seconds = time.perf_counter() - started
    return before - DeadLetter.objects.count(), seconds


def one_round(messages: int, partitions: int, processes: int, url: str,
              groups: list[str]) -> dict[str, float]:
    reset()
    preload(messages, partitions)
    rates = {}
    for name in groups:
        rates[name] = messages / drain(GROUPS[name], processes, 100, url)
    done, seconds = replay_all(messages)
    if done != messages:
        raise SystemExit(f"replayed {done} dead letters, not {messages}")
    rates["replay_seconds"] = seconds
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description="sqlqueue failure-path benchmark")
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--groups", default="ack,reject,twice",
                        help="which drains, in order (reject is needed for the replay)")
    args = parser.parse_args()
    groups = args.groups.split(",")
    if "reject" not in groups or not set(groups) <= set(GROUPS):
        parser.error(f"--groups: some of {', '.join(GROUPS)}, reject among them")
    setup(args.url)
    rounds = [one_round(args.messages, args.partitions, args.processes, args.url, groups)
              for _ in range(args.rounds)]
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    ack = median.get("ack")
    print(json.dumps({
        "messages": args.messages, "partitions": args.partitions,
        "processes": args.processes,
        "rounds": [{k: round(v, 1) for k, v in r.items()} for r in rounds],
        **{f"{name}_per_s": round(median[name]) for name in groups},
        **({f"{name}_to_ack": round(median[name] / ack, 2) for name in groups
            if name != "ack"} if ack else {}),
        "replay_seconds": round(median["replay_seconds"], 1),
        "note": "drain rates include process start-up; each round on a fresh log",
    }, indent=2))
    reset()


if __name__ == "__main__":
    main()
