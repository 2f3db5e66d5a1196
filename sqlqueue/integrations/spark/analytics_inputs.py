"""The analytics job's inputs: the messages, dead letters and delivery state of a window,
as Spark DataFrames, from the live database (the ``sqlqueue`` data source) or from the
Parquet archive (``manage.py queue archive``). Only the columns the job needs are read
(never payloads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MESSAGE_SCHEMA = (
    "offset long, topic string, partition_key string, id string, created_at timestamp, "
    "consumer_group string, original_topic string, last_error string, "
    "failure_detail string"
)
STATE_SCHEMA = (
    "consumer_group string, topic string, partition_key string, message_offset long, "
    "acked boolean, retry_count int, acked_at timestamp"
)


@dataclass(frozen=True)
class Window:
    since: datetime | None = None
    until: datetime | None = None

    def describe(self) -> str:
        def show(moment: datetime | None, default: str) -> str:
            return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else default

        return f"{show(self.since, 'the beginning')} to {show(self.until, 'now')}"


@dataclass
class Inputs:
    """The job's inputs, as Spark DataFrames (already cut to the window and topics)."""

    messages: DataFrame  # the log's messages (no dead letters)
    dead_letters: DataFrame
    states: DataFrame  # delivery state of finished messages
    source: str  # for the report: where the data came from


def live_inputs(spark: SparkSession, url: str, window: Window,
                topics: Sequence[str] = ()) -> Inputs:
    """From the database, through the ``sqlqueue`` source."""
    def table(name: str, schema: str) -> DataFrame:
        return (spark.read.format("sqlqueue").option("url", url).option("table", name)
                .schema(schema).load())

    from sqlqueue.integrations.spark.connect import Database

    return _cut(table("messages", MESSAGE_SCHEMA), table("delivery_state", STATE_SCHEMA),
                window, topics, source=Database.from_url(url).describe())


def archive_inputs(spark: SparkSession, directory: str | Path, window: Window,
                   topics: Sequence[str] = ()) -> Inputs:
    """From the Parquet archive written by ``manage.py queue archive``."""
    root = Path(directory)
    if not (root / "messages").is_dir():
        raise FileNotFoundError(f"{root} holds no archive (no messages/ folder)")
    # An explicit schema: partition values (topic=...) stay strings, never inferred.
    messages = spark.read.schema(MESSAGE_SCHEMA + ", date string").parquet(
        str(root / "messages"))
    if (root / "deliveries").is_dir():
        states = spark.read.schema(STATE_SCHEMA + ", date string").parquet(
            str(root / "deliveries"))
    else:
        states = spark.createDataFrame([], STATE_SCHEMA)
    return _cut(messages.drop("date"), states.drop("date"), window, topics,
                source=f"archive {root}")


def _cut(messages: DataFrame, states: DataFrame, window: Window, topics: Sequence[str],
         source: str) -> Inputs:
    from pyspark.sql import functions as F

    dead = (F.col("consumer_group") != "") & (F.col("original_topic") != "")
    in_window = F.lit(True)
    if window.since is not None:
        in_window &= F.col("created_at") >= F.lit(window.since)
    if window.until is not None:
        in_window &= F.col("created_at") < F.lit(window.until)
    messages = messages.where(in_window)
    normal, dead_letters = messages.where(~dead), messages.where(dead)
    states = states.where(F.col("acked") & F.col("acked_at").isNotNull())
    if topics:
        normal = normal.where(F.col("topic").isin(list(topics)))
        dead_letters = dead_letters.where(F.col("original_topic").isin(list(topics)))
        states = states.where(F.col("topic").isin(list(topics)))
    return Inputs(normal, dead_letters, states, source)
