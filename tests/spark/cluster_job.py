"""A job for ``spark-submit --master spark://...`` (tests/spark/test_cluster.py): the
source found by name on a plain session (no registration), a read, a write from several
executors, and an ``availableNow`` stream; prints one JSON line with what it saw."""

from __future__ import annotations

import json
import sys
import tempfile

from pyspark.sql import SparkSession


def main(url: str) -> None:
    spark = SparkSession.builder.appName("sqlqueue-cluster-smoke").getOrCreate()
    read = (spark.read.format("sqlqueue").option("url", url).option("topic", "cluster.in")
            .load())
    ids = sorted(row["id"] for row in read.select("id").collect())
    written = (spark.createDataFrame([({"n": n}, f"k{n % 4}", f"out-{n}") for n in range(60)],
                                     "payload struct<n:int>, partition_key string, id string")
               .repartition(4))
    written.write.format("sqlqueue").option("url", url).option("topic", "cluster.out") \
        .mode("append").save()
    seen: list[str] = []

    def collect(batch: object, _: int) -> None:
        seen.extend(row["id"] for row in batch.select("id").collect())  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("sqlqueue").option("url", url)
                 .option("topic", "cluster.in").option("maxTransactionAge", "1").load()
                 .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    print(json.dumps({"master": spark.sparkContext.master, "read": ids,
                      "streamed": sorted(seen), "executors": executors}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
