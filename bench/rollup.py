"""The per-minute rollup's cost (issue 42): the same drain with and without it, in this
process, interleaved (ABBA order, so that a machine getting busier or quieter weighs on
both), on tables emptied between rounds.

    .venv/bin/python -m bench.rollup                        # MariaDB: sqlqueue_bench
    .venv/bin/python -m bench.rollup --url mysql://root@127.0.0.1:3306/mine --rounds 8

Prints JSON: each variant's drain seconds (median, min, max), the median's difference
in percent and per message, and the rollup's own counting cost per handler run (no
database; what a handler thread spends in it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench.common import reset, setup
from bench.drain import preload


def drain_in_process(group: str, with_rollup: bool) -> float:
    from django.db import connections

    from sqlqueue.conf import get_settings
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.rollup import MinuteRollup
    from sqlqueue.consuming.runner import Runner

    runner = Runner(select_consumers([group], []), until_empty=True, conf=get_settings())
    rollup = None
    if with_rollup:
        rollup = MinuteRollup.of(runner)
        runner.pacer.timers.append(rollup)
    started = time.perf_counter()
    runner.run(install_signal_handlers=False)
    if rollup is not None:
        rollup.flush()
    elapsed = time.perf_counter() - started
    connections.close_all()
    return elapsed


def empty_rollup() -> None:
    from django.db import connection

    empty = "DELETE FROM" if connection.vendor == "sqlite" else "TRUNCATE TABLE"
    with connection.cursor() as cursor:
        cursor.execute(f"{empty} queue_minute_stats")


def counting_cost(runs: int = 200_000) -> dict[str, float]:
    """Microseconds per handler run the rollup costs, without a database: on the handler
    thread (``handled`` and ``finished``: counting into the thread's own rows) and on the
    main thread (summing the threads' rows up, per row: next to nothing per run)."""
    from sqlqueue.conf import get_settings
    from sqlqueue.consuming.handlers import Delivery
    from sqlqueue.consuming.instruments import Instruments
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.rollup import MinuteRollup
    from sqlqueue.storage.sql.tables import FetchedRow

    consumer = select_consumers(["bench-unordered"], [])[0]
    row = FetchedRow.__new__(FetchedRow)
    for name, value in (("offset", 1), ("created_at", 1_800_000_000_000),
                        ("deliver_after", 0)):
        object.__setattr__(row, name, value)
    delivery = Delivery(consumer=consumer, alias="default", partition_key="p", row=row,
                        attempt=1, sequence=1)
    rollup = MinuteRollup(Instruments(), alias="default", conf=get_settings(),
                          now_ms=lambda: 1_800_000_000_000,
                          estimate_ms=lambda: 1_800_000_000_000)
    started = time.perf_counter()
    for _ in range(runs):
        rollup.handled("bench-unordered", "bench.drain", "ack", 0.0004, 0.01)
        rollup.finished(delivery, "ack", 0.0004)
    handler_thread = time.perf_counter() - started
    started = time.perf_counter()
    rollup._sum_up()
    main_thread = time.perf_counter() - started
    return {"handler_thread_us_per_run": round(handler_thread / runs * 1e6, 3),
            "main_thread_us_per_run": round(main_thread / runs * 1e6, 3)}


def summary(seconds: list[float], messages: int) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {"median_s": round(median, 3), "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3), "messages_per_s": round(messages / median),
            "runs_s": [round(s, 3) for s in seconds]}


def main() -> None:
    parser = argparse.ArgumentParser(description="the per-minute rollup's cost on a drain")
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="drains of each variant")
    parser.add_argument("--group", default="bench-unordered")
    args = parser.parse_args()
    setup(args.url)
    times: dict[str, list[float]] = {"without": [], "with": []}
    for round_ in range(args.rounds):
        order = ("without", "with") if round_ % 2 == 0 else ("with", "without")
        for variant in order:
            reset()
            empty_rollup()
            preload(args.messages, args.partitions)
            times[variant].append(drain_in_process(args.group, variant == "with"))
    reset()
    empty_rollup()
    without, with_ = (statistics.median(times[v]) for v in ("without", "with"))
    print(json.dumps({
        "messages": args.messages, "partitions": args.partitions, "rounds": args.rounds,
        "without_rollup": summary(times["without"], args.messages),
        "with_rollup": summary(times["with"], args.messages),
        "median_difference_percent": round(100 * (with_ - without) / without, 2),
        "median_difference_us_per_message": round(1e6 * (with_ - without) / args.messages,
                                                  2),
        "counting_without_database": counting_cost(),
    }, indent=2))


if __name__ == "__main__":
    main()
