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

The inputs are read by ``analytics_inputs``, the aggregates computed by
``analytics_aggregates``; this module is the job (``run``) and its command line.
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
from typing import TYPE_CHECKING

# Re-exported: AGGREGATES and Window are imported from here (tests, sqlqueue.spark).
from sqlqueue.integrations.spark.analytics_aggregates import AGGREGATES as AGGREGATES
from sqlqueue.integrations.spark.analytics_aggregates import (
    BUCKETS,
    aggregate,
    aggregate_names,
)
from sqlqueue.integrations.spark.analytics_inputs import Window as Window
from sqlqueue.integrations.spark.analytics_inputs import archive_inputs, live_inputs
from sqlqueue.naming import url_has_secret

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession


@dataclass
class Report:
    """What the job produced: the aggregates (pandas) and where it wrote them."""

    window: Window
    source: str
    bucket: str
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    html: Path | None = None
    notes: list[str] = field(default_factory=list)


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
    if arguments.url is not None and url_has_secret(arguments.url):
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
