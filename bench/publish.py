"""Quick publish-rate measurement (the full benchmark suite is bench/README.md's job).

    .venv/bin/python -m bench.publish                       # MariaDB, database sqlqueue_bench
    .venv/bin/python -m bench.publish --url sqlite:////tmp/bench.sqlite3
    .venv/bin/python -m bench.publish --single 5000 --bulk 100000 --json out.json

Measures, on an emptied queue table, the median of --rounds runs (3 by default):
  single: one send_message per transaction.atomic() (what a web request does), and one
          outside any transaction (autocommit), each beside its floor measured in the same
          run, the blocks taken in turns: a bare INSERT of the same payload through
          Django's cursor, in atomic() and in autocommit (``single_vs_floor``: the ratios)
  bulk:   send_messages in batches of --batch messages, one transaction per batch
  bulk from --processes publishers at once (2 by default): the aggregate rate
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import django


def ensure_database(url: str, *, afresh: bool = False) -> None:
    """Create the benchmark database if missing (``afresh``: drop it first; it is
    scratch space)."""
    if url.startswith(("postgres", "pgsql")):
        _ensure_postgresql_database(url, afresh=afresh)
        return
    if not url.startswith("mysql"):
        return
    import MySQLdb

    parsed = __import__("environ").Env.db_url_config(url)
    server = MySQLdb.connect(host=parsed["HOST"] or "127.0.0.1", port=int(parsed["PORT"] or 3306),
                             user=parsed["USER"] or "root", passwd=parsed["PASSWORD"] or "")
    if afresh:
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{parsed['NAME']}`")
    server.cursor().execute(
        f"CREATE DATABASE IF NOT EXISTS `{parsed['NAME']}` CHARACTER SET utf8mb4"
    )
    server.close()


def _ensure_postgresql_database(url: str, *, afresh: bool) -> None:
    """``ensure_database`` on PostgreSQL: CREATE DATABASE runs outside a transaction,
    from the server's maintenance database ``postgres``."""
    import psycopg
    from psycopg import sql

    parsed = __import__("environ").Env.db_url_config(url)
    with psycopg.connect(host=parsed["HOST"] or "127.0.0.1", port=int(parsed["PORT"] or 5432),
                         user=parsed["USER"] or "postgres", password=parsed["PASSWORD"] or None,
                         dbname="postgres", autocommit=True) as server:
        name = sql.Identifier(parsed["NAME"])
        if afresh:
            server.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(name))
        if not server.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              [parsed["NAME"]]).fetchone():
            server.execute(sql.SQL("CREATE DATABASE {}").format(name))


def bench_single(count: int) -> dict[str, dict[str, Any]]:
    """One message at a time, four ways in turns (``bench.baseline.interleaved``):
    ``publish_atomic`` (``send_message`` in its own ``atomic()``), ``publish_autocommit``
    (outside any transaction), and their floors ``insert_atomic`` and
    ``insert_autocommit``: the same payload's JSON in a bare INSERT through Django's
    cursor."""
    from django.db import connection, transaction

    from bench.baseline import FloorTable, interleaved
    from sqlqueue import send_message

    def publish(first: int, size: int) -> None:
        for n in range(first, first + size):
            send_message("bench.single", {"seq": n, "t": time.time()},
                         partition_key=f"p{n % 16}")

    def insert(first: int, size: int) -> None:
        for n in range(first, first + size):  # a cursor each, as one INSERT in a view takes
            with connection.cursor() as cursor:
                cursor.execute(FloorTable.insert_sql,
                               [f"p{n % 16}", json.dumps({"seq": n, "t": time.time()})])

    def atomically(way: Callable[[int, int], None]) -> Callable[[int, int], None]:
        def each_in_atomic(first: int, size: int) -> None:
            for n in range(first, first + size):
                with transaction.atomic():
                    way(n, 1)
        return each_in_atomic

    with FloorTable():
        return interleaved({"publish_atomic": atomically(publish),
                            "insert_atomic": atomically(insert),
                            "publish_autocommit": publish, "insert_autocommit": insert},
                           count)


def bench_bulk(count: int, batch: int) -> float:
    from django.db import transaction

    from sqlqueue import OutgoingMessage, send_messages

    started = time.perf_counter()
    for first in range(0, count, batch):
        with transaction.atomic():
            send_messages("bench.bulk", [
                OutgoingMessage({"seq": n, "t": time.time()}, partition_key=f"p{n % 16}")
                for n in range(first, min(first + batch, count))
            ])
    return count / (time.perf_counter() - started)


def bench_bulk_parallel(count: int, batch: int, processes: int, url: str) -> float:
    """``count`` messages in bulk from ``processes`` publishers at once (each its own
    share, its own connection): the aggregate rate, from a common start to the last end."""
    start_at = time.time() + 2.0  # after every interpreter has started and set Django up
    workers = [subprocess.Popen(
        [sys.executable, "-m", "bench.publish", "--url", url, "--bulk-worker",
         str(count // processes), "--batch", str(batch), "--start-at", str(start_at)],
        stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    ends = [float(worker.communicate()[0].split()[-1]) for worker in workers]
    if any(worker.returncode for worker in workers):
        raise SystemExit("a publishing process failed")
    return (count // processes) * processes / (max(ends) - start_at)


def bulk_worker(count: int, batch: int, start_at: float) -> None:
    """One of ``bench_bulk_parallel``'s publishers: prints when it finished."""
    while time.time() < start_at:
        time.sleep(0.001)
    bench_bulk(count, batch)
    print(time.time())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench"))
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="run each scenario this many times; report the median")
    parser.add_argument("--processes", type=int, default=2,
                        help="publishers for the parallel bulk scenario")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--bulk-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bulk_worker is not None:
        from bench.common import setup

        setup(args.url)
        bulk_worker(args.bulk_worker, args.batch, args.start_at)
        return

    from bench.baseline import machine_probe
    from bench.common import reset, setup

    setup(args.url)
    from django.db import connection

    def rounds(scenario: Callable[[], float]) -> list[int]:
        measured = []
        for _ in range(args.rounds):
            reset()  # TRUNCATE: no purge of the last round's rows to compete with
            measured.append(round(scenario()))
        return measured

    probe = machine_probe()
    singles = []
    for _ in range(args.rounds):
        reset()
        singles.append(bench_single(args.single))
    bulk = rounds(lambda: bench_bulk(args.bulk, args.batch))
    parallel = rounds(lambda: bench_bulk_parallel(args.bulk, args.batch, args.processes,
                                                  args.url))
    results: dict[str, Any] = {
        "database": connection.vendor,
        "server_version": _server_version(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "probe": probe,
        **single_results(singles),
        "bulk_per_s": statistics.median_low(bulk),
        "bulk_rounds_per_s": bulk,
        "bulk_parallel_per_s": statistics.median_low(parallel),
        "bulk_parallel_rounds_per_s": parallel,
        "bulk_parallel_processes": args.processes,
        "single_count": args.single,
        "bulk_count": args.bulk,
        "batch": args.batch,
    }
    reset()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


def single_results(singles: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``bench_single``'s rounds as the report's figures: each way's median rate and
    its rounds, the CPU per message, and each publish as a share of its floor
    (``bench.baseline.ratio``, over all the rounds' blocks, with the spread)."""
    from bench.baseline import ratio

    ways = {way: {"per_s": statistics.median_low(r[way]["per_s"] for r in singles),
                  "rounds_per_s": [r[way]["per_s"] for r in singles],
                  "cpu_us": round(statistics.median(r[way]["cpu_us"] for r in singles), 1),
                  "block_s": [s for r in singles for s in r[way]["block_s"]]}
            for way in singles[0]}
    versus = {mode: ratio(ways[f"publish_{mode}"], ways[f"insert_{mode}"])
              for mode in ("atomic", "autocommit")}
    for figures in ways.values():
        del figures["block_s"]
    return {"single_per_s": ways["publish_atomic"]["per_s"],
            "single_rounds_per_s": ways["publish_atomic"]["rounds_per_s"],
            "single_ways": ways, "single_vs_floor": versus}


def _server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute({"mysql": "SELECT VERSION()", "postgresql": "SHOW server_version"}
                       .get(connection.vendor, "SELECT sqlite_version()"))
        return str(cursor.fetchone()[0])


if __name__ == "__main__":
    main()
