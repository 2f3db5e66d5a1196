"""Does the cost of polling grow with the table? (issue: "flat poll cost, ratio <= 1.5,
from 10^4 to 10^6 rows"; partition discovery with 10 vs 10,000 partitions.)

    python -m bench.costs                 # MariaDB, database sqlqueue_bench
    python -m bench.costs --quick         # 10^4 vs 10^5 rows, 10 vs 1,000 partitions

For each table size, the topic's messages are all retained and all but the newest
``BATCH`` of each partition are below the group's watermark (finished, not yet collected):
the steady state of a consumer with a long RETENTION. Then it times, over many calls,
the statements a subscriber runs every poll: ``head_offset`` (the idle poll) and
``fetch_messages`` of the next batch above the watermark. Discovery is timed on a
separate topic with 10 and with 10,000 partitions. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import bulk_load, reset, setup

TOPIC = "bench.costs"
PARTITIONS = 16
BATCH = 100


def timed(call: Callable[[], Any], repeat: int) -> float:
    """Median seconds of one call, after a warm-up."""
    for _ in range(10):
        call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def poll_costs(rows: int, repeat: int) -> dict[str, float]:
    from django.db import connection

    from sqlqueue.storage.sql import store_for

    reset()
    bulk_load(TOPIC, rows, PARTITIONS)
    store = store_for(connection)
    with connection.cursor() as cursor:
        heads = store.partition_heads(cursor, TOPIC)
        # The watermark of partition p0000: BATCH messages below its head.
        below = store.list_offsets(cursor, TOPIC, [("p0000", 0, heads["p0000"])],
                                     rows)["p0000"]
        watermark = below[-BATCH - 1]
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
        head = timed(lambda: store.head_offset(cursor), repeat)
        fetch = timed(lambda: store.fetch_messages(cursor, "g", TOPIC, "p0000", watermark,
                                                     BATCH), repeat)
    return {"head_offset_ms": round(head * 1000, 3), "fetch_batch_ms": round(fetch * 1000, 3)}


def discovery_cost(partitions: int, repeat: int) -> float:
    from django.db import connection

    from sqlqueue.storage.sql import store_for

    reset()
    bulk_load(TOPIC, max(partitions * 10, 10_000), partitions)
    store = store_for(connection)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
        found = store.discover_partitions(cursor, TOPIC)
        assert len(found) == partitions, (len(found), partitions)
        return round(timed(lambda: store.discover_partitions(cursor, TOPIC), repeat) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()
    setup(args.url)
    small, large = (10**4, 10**5) if args.quick else (10**4, 10**6)
    few, many = (10, 1000) if args.quick else (10, 10_000)
    polls = {rows: poll_costs(rows, args.repeat) for rows in (small, large)}
    discovery = {n: discovery_cost(n, max(10, args.repeat // 50)) for n in (few, many)}
    reset()
    print(json.dumps({
        "poll": {f"{rows} rows": cost for rows, cost in polls.items()},
        "poll_ratio": {
            key: round(polls[large][key] / polls[small][key], 2) for key in polls[small]
        },
        "discovery_ms": {f"{n} partitions": ms for n, ms in discovery.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
