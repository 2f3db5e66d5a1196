"""What ``IDEMPOTENCY_WINDOW`` costs (SPEC §9), sized for 10**7 messages a day.

    .venv/bin/python -m bench.idempotency                      # MariaDB, database sqlqueue_bench
    .venv/bin/python -m bench.idempotency --url sqlite:////tmp/bench.sqlite3 --keys 200000

1. storage: ``--keys`` remembered keys (random digests, as publishing writes them, in
   batches of 1,000), then the table's data + index bytes per key, and the size of a day's
   window at 10**7 messages with ids of the caller's;
2. publishing with that table in place, one ``send_message`` per transaction and
   ``send_messages`` in batches of 1,000: sqlqueue's own ids (no key), ids of the caller's
   with ``IDEMPOTENCY_WINDOW = 0`` (no key, the old behaviour) and with the default window;
3. garbage collection: expired keys deleted per second, against the 116 a second that
   10**7 a day need.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

PER_DAY = 10**7
BATCH = 1000


def fill_keys(count: int) -> float:
    """``count`` keys through the publisher's own statement; returns keys per second."""
    from django.db import connection, transaction

    from sqlqueue.storage.sql import store_for

    store = store_for(connection)
    rng = random.Random(13)
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        keys = sorted((rng.getrandbits(64) - 2**63, rng.getrandbits(64) - 2**63, first + n)
                      for n in range(min(BATCH, count - first)))
        with transaction.atomic(), connection.cursor() as cursor:
            store.remember_idempotency_keys(cursor, keys, 86_400_000)
    return count / (time.perf_counter() - started)


def table_bytes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_idempotency_keys")
            cursor.fetchall()
            cursor.execute(
                "SELECT DATA_LENGTH, INDEX_LENGTH FROM information_schema.TABLES WHERE "
                "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'queue_idempotency_keys'")
            data, index = cursor.fetchone()
            return {"data": int(data), "index": int(index)}
        if connection.vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE queue_idempotency_keys")  # the free space map
            cursor.execute("SELECT pg_table_size('queue_idempotency_keys'), "
                           "pg_indexes_size('queue_idempotency_keys')")
            data, index = cursor.fetchone()
            return {"data": int(data), "index": int(index)}
        # SQLite: the dbstat virtual table, when the library has it
        cursor.execute("SELECT name, SUM(pgsize) FROM dbstat WHERE name IN "
                       "('queue_idempotency_keys', 'idx_idempotency_expires', "
                       "'sqlite_autoindex_queue_idempotency_keys_1') GROUP BY name")
        sizes = dict(cursor.fetchall())
        data = int(sizes.pop("queue_idempotency_keys", 0))
        return {"data": data, "index": int(sum(sizes.values()))}


def publish_single(count: int, ids: str) -> float:
    from django.db import transaction

    from sqlqueue import send_message

    prefix = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for n in range(count):
        with transaction.atomic():
            send_message("bench.idem", {"seq": n}, partition_key=f"p{n % 16}",
                         id=None if ids == "sqlqueue" else f"order-{prefix}-{n}")
    return count / (time.perf_counter() - started)


def publish_bulk(count: int, ids: str) -> float:
    from django.db import transaction

    from sqlqueue import OutgoingMessage, send_messages

    prefix = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        with transaction.atomic():
            send_messages("bench.idem", [
                OutgoingMessage({"seq": n}, partition_key=f"p{n % 16}",
                                id=None if ids == "sqlqueue" else f"order-{prefix}-{n}")
                for n in range(first, min(first + BATCH, count))])
    return count / (time.perf_counter() - started)


def purge_rate() -> tuple[int, float]:
    """Expire every key, then time the collector's statement until none is left."""
    from django.db import connection

    from sqlqueue.storage.sql import store_for

    store = store_for(connection)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE queue_idempotency_keys SET expires_at = 1")
        deleted = 0
        started = time.perf_counter()
        while True:
            removed = store.delete_expired_idempotency_keys(cursor, BATCH)
            deleted += removed
            if removed < BATCH:
                break
        return deleted, deleted / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--keys", type=int, default=1_000_000,
                        help="keys in the table while publishing is measured")
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    from bench.common import reset, setup

    setup(args.url)
    from django.db import connection
    from django.test import override_settings

    reset()
    results: dict[str, Any] = {"database": connection.vendor, "keys": args.keys}
    results["fill_keys_per_s"] = round(fill_keys(args.keys))
    sizes = table_bytes()
    per_key = (sizes["data"] + sizes["index"]) / args.keys
    results.update({"table_bytes": sizes, "bytes_per_key": round(per_key, 1),
                    "day_window_at_1e7_per_day_MB": round(per_key * PER_DAY / 2**20)})

    def median(scenario: Callable[[int, str], float], count: int, ids: str) -> int:
        return round(statistics.median(scenario(count, ids) for _ in range(args.rounds)))

    for name, ids, window in (("sqlqueue_ids", "sqlqueue", 86400),
                              ("caller_ids_window_0", "caller", 0),
                              ("caller_ids_window_1d", "caller", 86400)):
        with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": window}):
            results[f"single_{name}_per_s"] = median(publish_single, args.single, ids)
            results[f"bulk_{name}_per_s"] = median(publish_bulk, args.bulk, ids)
    deleted, rate = purge_rate()
    results.update({"purged_keys": deleted, "purge_keys_per_s": round(rate),
                    "purge_needed_per_s_at_1e7_per_day": round(PER_DAY / 86400)})
    reset()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
