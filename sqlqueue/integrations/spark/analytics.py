"""The analytics job: what the queue did over a window, from the live database or the
Parquet archive, as aggregates (Parquet and CSV) and an HTML report with plots.

    DATABASE_URL=mysql://... python -m sqlqueue.spark.analytics --out report/
    spark-submit "$(python -c 'import sqlqueue.spark.analytics as m; print(m.__file__)')" \\
        --archive /data/queue-archive --out report/ --since 7d

Aggregates (docs/guides/spark.md has the columns):

* ``messages_per_hour``: messages stored per topic, partition and hour (``--bucket``
  makes it ``messages_per_minute``, ``..._second`` or ``..._day``: a demo lasts a minute);
* ``latency``: publish-to-ack latency percentiles (ms) and attempts per consumer group and
  topic. "Publish" is when the message was stored (``created_at``), "ack" when the group
  finished it (``acked_at``), both by the database clock; dead-lettered messages are left
  out (they are in ``dead_letters``);
* ``attempts``: how many messages needed 1, 2, ... attempts, per group and topic;
* ``dead_letters``: dead letters per group and topic, and their rate among the topic's
  messages; ``top_errors``: the most frequent last lines of their tracebacks;
* ``lag``: per group and topic, at the end of every hour (bucket), how many of the window's
  messages the group had not finished yet.

Latency, attempts and lag need each group's delivery state of finished messages, which
sqlqueue deletes as soon as a group's watermark passes them unless
``SQLQUEUE['KEEP_DELIVERY_STATE']`` is on (then it is deleted with its message, by
garbage collection; the archive exports it first).

Hours are UTC. The job reads only the columns it needs (never payloads).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pandas as pd
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
TOP_ERRORS = 10
ERROR_TEXT = 200  # characters of an error line kept
PERCENTILE_ACCURACY = 10_000
BUCKETS = {"second": "s", "minute": "min", "hour": "h", "day": "D"}  # -> pandas frequency


def aggregate_names(bucket: str = "hour") -> tuple[str, ...]:
    return (f"messages_per_{bucket}", "latency", "attempts", "dead_letters", "top_errors",
            "lag")


AGGREGATES = aggregate_names()


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


@dataclass
class Report:
    """What the job produced: the aggregates (pandas) and where it wrote them."""

    window: Window
    source: str
    bucket: str
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    html: Path | None = None
    notes: list[str] = field(default_factory=list)


# -- inputs ----------------------------------------------------------------------------------

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


# -- aggregates ---------------------------------------------------------------------------------

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


# -- the job ----------------------------------------------------------------------------------

def run(spark: SparkSession, out: str | Path, *, url: str | None = None,
        archive: str | Path | None = None, window: Window | None = None,
        topics: Sequence[str] = (), bucket: str = "hour") -> Report:
    """Read, aggregate, write ``out``/aggregates/*.parquet|csv, plots and report.html."""
    from sqlqueue.integrations.spark.report import write_report

    if (url is None) == (archive is None):
        raise ValueError("give exactly one of url (the live database) or archive (a folder)")
    if bucket not in BUCKETS:
        raise ValueError(f"bucket is one of {', '.join(BUCKETS)}, not {bucket!r}")
    window = window or Window()
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # buckets of UTC time
    try:
        inputs = (live_inputs(spark, url, window, topics) if url is not None
                  else archive_inputs(spark, archive or "", window, topics))
        report = Report(window, inputs.source, bucket, aggregate(inputs, bucket))
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone or "UTC")
    if report.frames["latency"].empty and not report.frames[f"messages_per_{bucket}"].empty:
        report.notes.append(
            "No delivery history: latency, attempts and lag need the groups' delivery state "
            "of finished messages. Set SQLQUEUE['KEEP_DELIVERY_STATE'] = True (and archive "
            "before garbage collection) to keep it.")
    write_aggregates(report, Path(out))
    report.html = write_report(report, Path(out))
    return report


def write_aggregates(report: Report, out: Path) -> None:
    folder = out / "aggregates"
    folder.mkdir(parents=True, exist_ok=True)
    for name in aggregate_names(report.bucket):
        frame = report.frames[name]
        frame.to_parquet(folder / f"{name}.parquet", index=False)
        frame.to_csv(folder / f"{name}.csv", index=False)


# -- command line -------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+)([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def moment(text: str) -> datetime:
    """``2026-01-31``, ``2026-01-31T12:00`` (UTC unless it says otherwise), or ``24h``,
    ``7d`` (that long ago)."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        amount, unit = int(relative.group(1)), _UNITS[relative.group(2)]
        return datetime.now(UTC) - timedelta(**{unit: amount})
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date, a date and time, or a duration like 24h or 7d") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sqlqueue.spark.analytics",
        description="Aggregates and an HTML report of what the queue did over a window.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--url", help="the live database, without a password: the command "
                                      "line is visible to every user (ps); default "
                                      "$DATABASE_URL, which may hold one")
    source.add_argument("--url-file", metavar="FILE",
                        help="read the live database's url from FILE (first line)")
    source.add_argument("--archive", metavar="DIR", help="a Parquet archive "
                                                         "(manage.py queue archive)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where report.html, plots/ and aggregates/ go")
    parser.add_argument("--since", type=moment, help="window start: a date, a time, or 7d")
    parser.add_argument("--until", type=moment, help="window end (exclusive)")
    parser.add_argument("--topic", action="append", default=[], help="only this topic")
    parser.add_argument("--bucket", choices=list(BUCKETS), default="hour",
                        help="time resolution of messages_per_* and lag (default hour)")
    parser.add_argument("--master", help="Spark master when not run by spark-submit "
                                         "(default local[*])")
    arguments = parser.parse_args(argv)
    if arguments.url is not None and urlsplit(arguments.url).password:
        parser.error("--url carries a password, which every user of this machine can read "
                     "in the process list: set DATABASE_URL or use --url-file instead")
    if arguments.url_file is not None:
        try:
            lines = Path(arguments.url_file).read_text().splitlines()
        except OSError as exc:
            parser.error(f"--url-file: cannot read {arguments.url_file}: {exc.strerror}")
        arguments.url = lines[0].strip() if lines else ""
        if not arguments.url:
            parser.error(f"--url-file: {arguments.url_file} is empty")
    if arguments.url is None and arguments.archive is None:
        arguments.url = os.environ.get("DATABASE_URL")
        if not arguments.url:
            parser.error("give --url-file, --url or --archive (or set DATABASE_URL)")
    return arguments


def session(master: str | None) -> SparkSession:
    from pyspark.sql import SparkSession

    from sqlqueue.integrations.spark.session import prepare_environment, register

    prepare_environment()
    builder = (SparkSession.builder.appName("sqlqueue analytics")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")  # the report's lines, not Spark's warnings
    register(spark)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    spark = session(arguments.master)
    report = run(spark, arguments.out, url=arguments.url, archive=arguments.archive,
                 window=Window(arguments.since, arguments.until), topics=arguments.topic,
                 bucket=arguments.bucket)
    summary = report.frames[f"messages_per_{report.bucket}"]["messages"].sum()
    print(f"Report on {int(summary)} message(s) from {report.source}, "
          f"{report.window.describe()}:")
    print(f"  {report.html}")
    print(f"  aggregates: {Path(arguments.out) / 'aggregates'} (Parquet and CSV)")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
