"""Spark read and write throughput of the ``sqlqueue`` data source, against the Parquet
alternative (docs/guides/spark.md, "Throughput").

    .venv/bin/python -m bench.spark_io                      # MariaDB, 200,000 rows
    .venv/bin/python -m bench.spark_io --rows 50000 --url mysql://root@127.0.0.1:3306/x
    .venv/bin/python -m bench.spark_io --url postgres://postgres@127.0.0.1:5432/x

Write: the same DataFrame (200-byte JSON payloads, 16 partition keys, ids given) published
by ``df.write.format("sqlqueue")`` through LOAD DATA and through INSERT; against it, the
way without the source: the rows in a Parquet file, published by a plain Python loop of
``send_messages`` in batches of 1,000 (and, as a ceiling, Spark writing that Parquet file).

Read: the whole log into Spark (``format("noop")`` forces every row, collects nothing) by
the source, all columns and without payloads; against it, the Parquet export (plain
Python: mysqlclient -> Arrow -> Parquet, one process) and Spark reading that file.

Each figure is the best of ``--repeat`` runs (default 2), in rows per second, after one
warm-up job. Spark runs ``local[2]``. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_URL = "mysql://root@127.0.0.1:3306/sqlqueue_spark_bench"
TOPIC = "bench.spark"


def setup_django(url: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"  # not an inherited one
    if url.startswith("mysql"):
        from sqlqueue.integrations.spark.connect import Database

        database = Database.from_url(url)
        import MySQLdb

        server = MySQLdb.connect(host=database.host, port=database.port, user=database.user,
                                 password=database.password)
        server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{database.name}` "
                                "CHARACTER SET utf8mb4")
        server.close()
    elif url.startswith("postgres"):
        import psycopg

        from sqlqueue.integrations.spark.connect import Database

        database = Database.from_url(url)
        with psycopg.connect(host=database.host, port=database.port, user=database.user,
                             password=database.password or None, dbname="postgres",
                             autocommit=True) as server:
            if not server.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  [database.name]).fetchone():
                server.execute(f'CREATE DATABASE "{database.name}" ENCODING \'UTF8\'')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def empty_log() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {connection.ops.quote_name('queue_messages')}")


def best(repeat: int, job: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
    """The shortest of ``repeat`` timed runs of ``job`` (``before`` runs untimed first)."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        job()
        times.append(time.perf_counter() - started)
    return min(times)


def frame_of(spark: Any, rows: int) -> Any:
    """The rows to publish, computed once and cached (generation is not timed)."""
    from pyspark.sql import functions as F

    padding = "x" * 150
    frame = (spark.range(rows, numPartitions=4)
             .select(F.to_json(F.struct(F.col("id").alias("n"), F.lit(padding).alias("pad")))
                     .alias("payload"),
                     F.concat(F.lit("key-"), (F.col("id") % 16).cast("string"))
                     .alias("partition_key"),
                     F.concat(F.lit("row-"), F.col("id").cast("string")).alias("id"))
             .cache())
    frame.count()
    return frame


def export_parquet(url: str, path: Path) -> int:
    """The whole log to one Parquet file, without Spark (the source's own read path)."""
    import pyarrow.parquet as pq

    from sqlqueue.integrations.spark.arrow import arrow_schema, record_batch
    from sqlqueue.integrations.spark.connect import Database
    from sqlqueue.integrations.spark.tables import TABLES

    table = TABLES["messages"]
    count = 0
    with Database.from_url(url).connect() as db, pq.ParquetWriter(
            path, arrow_schema(table.columns), compression="zstd") as writer:
        for chunk in db.batches(db.sql.rows_in_range(table, table.columns, 0, 1 << 62), 10_000):
            writer.write_batch(record_batch(chunk, table.columns))
            count += len(chunk)
    return count


def publish_from_parquet(path: Path) -> None:
    """The way without the source: read the file, send_messages in batches of 1,000."""
    import pyarrow.parquet as pq

    from sqlqueue import OutgoingMessage, send_messages

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1000):
        rows = batch.to_pylist()
        send_messages(TOPIC, [OutgoingMessage(json.loads(r["payload"]),
                                              partition_key=r["partition_key"], id=r["id"])
                              for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    arguments = parser.parse_args()
    setup_django(arguments.url)
    from sqlqueue.spark import local_session

    spark = local_session("sqlqueue bench", cores=2,
                          config={"spark.driver.memory": "2g",
                                  "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    rows, url, repeat = arguments.rows, arguments.url, arguments.repeat
    work = Path(tempfile.mkdtemp(prefix="sqlqueue-spark-bench-"))
    results: dict[str, float] = {}
    try:
        frame = frame_of(spark, rows)

        def write(bulk: str) -> Callable[[], None]:
            return lambda: (frame.write.format("sqlqueue").option("url", url)
                            .option("topic", TOPIC).option("bulkLoad", bulk).mode("append")
                            .save())

        write("on")()  # warm-up: workers started, table pages cached
        if url.startswith("postgres"):  # one path: COPY, then INSERT ... SELECT
            results["write: source, COPY"] = rows / best(repeat, write("off"), empty_log)
        else:
            results["write: source, LOAD DATA"] = rows / best(repeat, write("on"), empty_log)
            results["write: source, INSERT"] = rows / best(repeat, write("off"), empty_log)
        parquet_in = work / "in.parquet"
        results["write: Spark -> Parquet (ceiling)"] = rows / best(
            repeat, lambda: frame.coalesce(1).write.mode("overwrite").parquet(str(parquet_in)))
        single = next(parquet_in.glob("*.parquet"))
        results["write: Parquet -> send_messages"] = rows / best(
            1, lambda: publish_from_parquet(single), empty_log)

        empty_log()
        write("auto")()  # the log to read
        reader = spark.read.format("sqlqueue").option("url", url).option("numPartitions", "2")

        def read_all() -> None:
            reader.load().write.format("noop").mode("overwrite").save()

        def read_narrow() -> None:
            (reader.schema("offset long, topic string, partition_key string, "
                           "created_at timestamp").load()
             .write.format("noop").mode("overwrite").save())

        results["read: source, all columns"] = rows / best(repeat, read_all)
        results["read: source, 4 columns (no payload)"] = rows / best(repeat, read_narrow)
        exported = work / "export.parquet"
        export_seconds = best(repeat, lambda: export_parquet(url, exported))
        results["read: Parquet export (plain Python)"] = rows / export_seconds
        read_seconds = best(repeat, lambda: spark.read.parquet(str(exported)).write
                            .format("noop").mode("overwrite").save())
        results["read: Spark reads the Parquet file"] = rows / read_seconds
        results["read: export + Spark read"] = rows / (export_seconds + read_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()

    width = max(len(name) for name in results)
    print(f"\n{rows:,} rows, best of {repeat}, Spark local[2], {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, rate in results.items():
        print(f"  {name:<{width}}  {rate:>10,.0f} rows/s")
    print(json.dumps({"rows": rows, "repeat": repeat, "python": platform.python_version(),
                      "results": {k: round(v) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
