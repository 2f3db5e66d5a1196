"""The cost of SQLQUEUE['KEEP_DELIVERY_STATE'] (what the analytics report needs kept).

    .venv/bin/python -m bench.keep_state                  # MariaDB, 20,000 messages
    .venv/bin/python -m bench.keep_state --messages 50000 --url mysql://root@127.0.0.1/x

For each setting: pre-load the messages (16 partitions), drain them with one
``runconsumer --until-empty`` process (no-op handler, batch 100; start-up included), then
measure ``queue_delivery_state`` (rows, data and index bytes after ANALYZE TABLE) and the
time of ``group_lag()``, which counts a group's unfinished state rows of a topic. Prints
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.spark_io import setup_django

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "mysql://root@127.0.0.1:3306/sqlqueue_spark_bench"
TABLES = ("queue_messages", "queue_delivery_state", "queue_offsets",
          "queue_partition_leases", "queue_subscriber_heartbeats")


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


def preload(count: int) -> None:
    from django.db import transaction

    from bench.consumers import TOPIC
    from sqlqueue import OutgoingMessage, send_messages

    for first in range(0, count, 1000):
        with transaction.atomic():
            send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"p{n % 16}")
                                  for n in range(first, min(first + 1000, count))])


def drain(url: str, keep: bool) -> float:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "BENCH_DATABASE_URL": url, "BENCH_BATCH": "100",
           "BENCH_SQLQUEUE_JSON": json.dumps({"KEEP_DELIVERY_STATE": keep,
                                              "RETENTION": 3600})}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "django", "runconsumer", "--group",
                    "bench-unordered", "--until-empty", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    return time.perf_counter() - started


def state_table() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM queue_delivery_state")
        rows = int(cursor.fetchone()[0])
        if connection.vendor != "mysql":
            return {"rows": rows}
        cursor.execute("ANALYZE TABLE queue_delivery_state")
        cursor.fetchall()
        cursor.execute("SELECT data_length, index_length FROM information_schema.TABLES "
                       "WHERE table_schema = DATABASE() AND table_name = 'queue_delivery_state'")
        data, index = cursor.fetchone()
    return {"rows": rows, "data_bytes": int(data), "index_bytes": int(index)}


def lag_seconds() -> float:
    from bench.consumers import TOPIC
    from sqlqueue.operations.lag import group_lag

    times = []
    for _ in range(5):
        started = time.perf_counter()
        group_lag("bench-unordered", TOPIC)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--messages", type=int, default=20_000)
    arguments = parser.parse_args()
    setup_django(arguments.url)
    results = {}
    for keep in (False, True):
        reset()
        preload(arguments.messages)
        seconds = drain(arguments.url, keep)
        results[f"KEEP_DELIVERY_STATE={keep}"] = {
            "drain_messages_per_s": round(arguments.messages / seconds),
            "delivery_state": state_table(),
            "group_lag_ms": round(1000 * lag_seconds(), 1),
        }
    reset()
    print(json.dumps({"messages": arguments.messages, "results": results}, indent=2))


if __name__ == "__main__":
    main()
