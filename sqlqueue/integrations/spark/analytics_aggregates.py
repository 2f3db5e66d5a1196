"""The analytics job's aggregates, computed by Spark and collected as small pandas frames:
messages per bucket, latency, attempts, dead letters, top errors and lag over time (the
columns are in docs/guides/spark.md; the job is sqlqueue.integrations.spark.analytics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

    from sqlqueue.integrations.spark.analytics_inputs import Inputs

TOP_ERRORS = 10
ERROR_TEXT = 200  # characters of an error line kept
PERCENTILE_ACCURACY = 10_000
BUCKETS = {"second": "s", "minute": "min", "hour": "h", "day": "D"}  # -> pandas frequency


def aggregate_names(bucket: str = "hour") -> tuple[str, ...]:
    return (f"messages_per_{bucket}", "latency", "attempts", "dead_letters", "top_errors",
            "lag")


AGGREGATES = aggregate_names()


def aggregate(inputs: Inputs, bucket: str = "hour") -> dict[str, pd.DataFrame]:
    """Every aggregate, small enough to collect (pandas); times in ``bucket`` s."""
    from pyspark.sql import Window as SparkWindow
    from pyspark.sql import functions as F

    messages = inputs.messages.cache()
    dead_letters = inputs.dead_letters.withColumn(
        "message_offset", F.get_json_object("failure_detail", "$.offset").cast("long")).cache()
    frames: dict[str, Any] = {}
    when = F.date_trunc(bucket, "created_at").alias(bucket)
    frames[f"messages_per_{bucket}"] = (messages.groupBy("topic", "partition_key", when)
                                        .agg(F.count("*").alias("messages"))
                                        .orderBy("topic", "partition_key", bucket))

    # Finished messages of the window, without those that were dead-lettered.
    finished = (inputs.states.alias("s")
                .join(messages.alias("m"), (F.col("s.topic") == F.col("m.topic"))
                      & (F.col("s.partition_key") == F.col("m.partition_key"))
                      & (F.col("s.message_offset") == F.col("m.offset")))
                .join(dead_letters.alias("d"),
                      (F.col("d.consumer_group") == F.col("s.consumer_group"))
                      & (F.col("d.original_topic") == F.col("s.topic"))
                      & (F.col("d.message_offset") == F.col("s.message_offset")), "left_anti")
                .select(F.col("s.consumer_group").alias("consumer_group"),
                        F.col("s.topic").alias("topic"),
                        (F.unix_millis("s.acked_at") - F.unix_millis("m.created_at"))
                        .alias("latency_ms"),
                        (F.col("s.retry_count") + 1).alias("attempts"),
                        F.col("s.acked_at").alias("acked_at"))).cache()
    percentiles = F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], PERCENTILE_ACCURACY)
    frames["latency"] = (finished.groupBy("consumer_group", "topic").agg(
        F.count("*").alias("acked"), percentiles.alias("p"), F.max("latency_ms").alias("max_ms"),
        F.round(F.avg("attempts"), 3).alias("mean_attempts"),
        F.max("attempts").alias("max_attempts"),
        F.sum(F.when(F.col("attempts") > 1, 1).otherwise(0)).alias("retried"),
    ).select("consumer_group", "topic", "acked", F.col("p")[0].alias("p50_ms"),
             F.col("p")[1].alias("p90_ms"), F.col("p")[2].alias("p99_ms"), "max_ms",
             "mean_attempts", "max_attempts", "retried").orderBy("consumer_group", "topic"))
    frames["attempts"] = (finished.groupBy("consumer_group", "topic", "attempts")
                          .agg(F.count("*").alias("messages"))
                          .orderBy("consumer_group", "topic", "attempts"))

    published = messages.groupBy("topic").agg(F.count("*").alias("messages"))
    frames["dead_letters"] = (dead_letters.groupBy("consumer_group", "original_topic")
                              .agg(F.count("*").alias("dead_letters"))
                              .withColumnRenamed("original_topic", "topic")
                              .join(published, "topic", "left").fillna(0, ["messages"])
                              .withColumn("rate", F.round(F.when(
                                  F.col("messages") > 0,
                                  F.col("dead_letters") / F.col("messages")), 6))
                              .select("consumer_group", "topic", "dead_letters", "messages",
                                      "rate")
                              .orderBy("consumer_group", "topic"))
    error = F.substring(F.trim(F.element_at(F.filter(
        F.split(F.coalesce("last_error", F.lit("")), "\n"), lambda line: F.trim(line) != ""),
        -1)), 1, ERROR_TEXT)
    ranked = SparkWindow.partitionBy("consumer_group", "topic").orderBy(
        F.desc("dead_letters"), "error")
    frames["top_errors"] = (dead_letters.withColumn("error", F.coalesce(error, F.lit("")))
                            .groupBy("consumer_group", F.col("original_topic").alias("topic"),
                                     "error")
                            .agg(F.count("*").alias("dead_letters"))
                            .withColumn("rank", F.row_number().over(ranked))
                            .where(F.col("rank") <= TOP_ERRORS)
                            .orderBy("consumer_group", "topic", "rank"))

    frames["published"] = messages.groupBy("topic", when).agg(F.count("*").alias("published"))
    frames["acked"] = (finished.unionByName(_dead_lettered_finishes(inputs, messages))
                       .groupBy("consumer_group", "topic",
                                F.date_trunc(bucket, "acked_at").alias(bucket))
                       .agg(F.count("*").alias("acked")))
    collected = {name: _pandas(frame) for name, frame in frames.items()}
    for cached in (messages, dead_letters, finished):
        cached.unpersist()
    collected["lag"] = lag_over_time(collected.pop("published"), collected.pop("acked"),
                                     bucket)
    return collected


def _dead_lettered_finishes(inputs: Inputs, messages: DataFrame) -> DataFrame:
    """Dead-lettered messages are finished for their group too (for lag), at the time
    their state was acked."""
    from pyspark.sql import functions as F

    return (inputs.states.alias("s")
            .join(messages.alias("m"), (F.col("s.topic") == F.col("m.topic"))
                  & (F.col("s.partition_key") == F.col("m.partition_key"))
                  & (F.col("s.message_offset") == F.col("m.offset")))
            .join(inputs.dead_letters.withColumn(
                "message_offset", F.get_json_object("failure_detail", "$.offset")
                .cast("long")).alias("d"),
                  (F.col("d.consumer_group") == F.col("s.consumer_group"))
                  & (F.col("d.original_topic") == F.col("s.topic"))
                  & (F.col("d.message_offset") == F.col("s.message_offset")), "left_semi")
            .select(F.col("s.consumer_group").alias("consumer_group"),
                    F.col("s.topic").alias("topic"),
                    (F.unix_millis("s.acked_at") - F.unix_millis("m.created_at"))
                    .alias("latency_ms"),
                    (F.col("s.retry_count") + 1).alias("attempts"),
                    F.col("s.acked_at").alias("acked_at")))


def _pandas(frame: DataFrame) -> pd.DataFrame:
    """Collect, with every timestamp as an aware UTC one."""
    import pandas as pd

    result: Any = frame.toPandas()  # pyspark types it loosely; pandas has no stubs here
    for column in result.columns:
        if pd.api.types.is_datetime64_any_dtype(result[column]):
            values = pd.to_datetime(result[column])
            result[column] = (values.dt.tz_localize("UTC") if values.dt.tz is None
                              else values.dt.tz_convert("UTC"))
    return result


def lag_over_time(published: pd.DataFrame, acked: pd.DataFrame,
                  bucket: str = "hour") -> pd.DataFrame:
    """Per (group, topic) and bucket: messages of the window published by the end of the
    bucket that the group had not finished by then."""
    import pandas as pd

    columns = ["consumer_group", "topic", bucket, "published", "acked", "lag"]
    if acked.empty or published.empty:
        return pd.DataFrame(columns=columns)
    start = min(published[bucket].min(), acked[bucket].min())
    end = max(published[bucket].max(), acked[bucket].max())
    moments = pd.date_range(start, end, freq=BUCKETS[bucket], tz="UTC")
    rows = []
    for (group, topic), done in acked.groupby(["consumer_group", "topic"]):
        made = published[published["topic"] == topic].set_index(bucket)["published"]
        finished = done.set_index(bucket)["acked"]
        made_total = made.reindex(moments, fill_value=0).cumsum()
        done_total = finished.reindex(moments, fill_value=0).cumsum()
        for moment in moments:
            rows.append((group, topic, moment, int(made_total[moment]), int(done_total[moment]),
                         int(made_total[moment] - done_total[moment])))
    return pd.DataFrame(rows, columns=columns).sort_values(["consumer_group", "topic", bucket],
                                                           ignore_index=True)
