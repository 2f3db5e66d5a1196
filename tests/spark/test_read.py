"""Batch reads: what Spark reads equals what was published."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.models import PartitionOffset, QueueMessage


def publish_sample() -> list[Any]:
    sent = send_messages("orders", [
        OutgoingMessage({"n": n, "text": 'a "quote", a \\ and\na newline', "ünï": "çødé"},
                        partition_key=f"customer-{n % 3}", id=f"order-{n}",
                        metadata={"source": "test"} if n % 2 else None, priority=n)
        for n in range(20)
    ])
    send_message("other", {"elsewhere": True})
    send_message("orders", [1, 2, 3])  # unkeyed: a default-N partition, a fresh id
    return sent


def test_read_equals_what_was_published(spark: Any, db_url: str) -> None:
    publish_sample()
    frame = (spark.read.format("sqlqueue").option("url", db_url).option("topic", "orders")
             .option("numPartitions", "3").load())
    assert frame.rdd.getNumPartitions() == 3
    rows = {r["offset"]: r for r in frame.selectExpr(
        "*", "unix_millis(created_at) AS created_ms", "unix_millis(published_at) AS published_ms",
    ).collect()}
    stored = {m.offset: m for m in QueueMessage.objects.filter(topic="orders")}
    assert set(rows) == set(stored) and len(rows) == 21
    for offset, message in stored.items():
        row = rows[offset]
        assert (row["topic"], row["partition_key"], row["id"]) == (
            "orders", message.partition_key, message.id)
        assert json.loads(row["payload"]) == json.loads(bytes(message.payload))
        assert (json.loads(row["metadata"]) if row["metadata"] else None) == message.metadata
        assert row["priority"] == message.priority
        assert row["created_ms"] == message.created_at
        assert row["published_ms"] == message.published_at
        assert row["failed_at"] is None and row["deliver_after"] is None  # 0 = none


def test_timestamps_are_utc_instants_in_any_time_zone(spark: Any, db_url: str) -> None:
    """The JVM and the workers run in New York; the session time zone is changed too.
    The instant read is the stored epoch, and it is shown as wall-clock time of the
    session's zone, as Spark timestamps are."""
    send_message("clock", {"at": "now"})
    created = QueueMessage.objects.get(topic="clock").created_at
    frame = spark.read.format("sqlqueue").option("url", db_url).option("topic", "clock").load()
    for zone in ("America/New_York", "UTC", "Asia/Kolkata"):
        spark.conf.set("spark.sql.session.timeZone", zone)
        try:
            row = frame.selectExpr(
                "unix_millis(created_at) AS ms",
                "date_format(created_at, 'yyyy-MM-dd HH:mm:ss.SSS') AS wall",
                "date_format(to_utc_timestamp(created_at, current_timezone()), "
                "'yyyy-MM-dd HH:mm:ss.SSS') AS utc_wall",
            ).first()
        finally:
            spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        assert row["ms"] == created
        from datetime import UTC, datetime
        from zoneinfo import ZoneInfo

        instant = datetime.fromtimestamp(created / 1000, tz=UTC)
        assert row["wall"] == instant.astimezone(ZoneInfo(zone)).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3]
        assert row["utc_wall"] == instant.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def test_a_narrower_schema_reads_only_those_columns(spark: Any, db_url: str) -> None:
    publish_sample()
    frame = (spark.read.format("sqlqueue").option("url", db_url)
             .schema("offset long, topic string, created_at timestamp").load())
    assert frame.columns == ["offset", "topic", "created_at"]
    assert frame.count() == QueueMessage.objects.count() == 22


def test_offset_bounds_and_an_empty_log(spark: Any, db_url: str) -> None:
    reader = spark.read.format("sqlqueue").option("url", db_url)
    assert reader.load().count() == 0
    sent = publish_sample()
    first, last = sent[3].offset, sent[9].offset
    bounded = (reader.option("fromOffset", str(first)).option("untilOffset", str(last))
               .option("topic", "orders").load())
    assert sorted(r["offset"] for r in bounded.select("offset").collect()) == [
        s.offset for s in sent[3:9]]


def test_other_tables(spark: Any, db_url: str) -> None:
    publish_sample()
    PartitionOffset.objects.create(consumer_group="billing", topic="orders",
                                   partition_key="customer-1", offset_acked=7, updated_at=1000)
    offsets = spark.read.format("sqlqueue").option("url", db_url).option("table", "offsets")
    row = offsets.load().selectExpr("*", "unix_millis(updated_at) AS ms").first()
    assert (row["consumer_group"], row["partition_key"], row["offset_acked"], row["ms"]) == (
        "billing", "customer-1", 7, 1000)
    for table in ("delivery_state", "leases", "heartbeats", "dead_letters"):
        frame = spark.read.format("sqlqueue").option("url", db_url).option("table", table)
        assert frame.load().count() == 0


@pytest.mark.parametrize(("options", "message"), [
    ({}, "option 'url' is required"),
    ({"url": "redis://x/y"}, "must start with mysql://, postgres:// or sqlite://"),
    ({"url": "postgres://x/"}, "must name the database"),
    ({"url": "sqlite://"}, "must name a file"),
    ({"numPartitions": "0"}, "'numPartitions' must be >= 1"),
    ({"numpartitions": "many"}, "must be a whole number"),
    ({"table": "jobs"}, "use one of messages, dead_letters"),
    ({"topicz": "x"}, "unknown option 'topicz'"),
    ({"topic": "a\nb"}, "control character"),
])
def test_bad_options_are_refused_with_their_name(spark: Any, db_url: str,
                                                 options: dict[str, str], message: str) -> None:
    reader = spark.read.format("sqlqueue")
    options = {"url": db_url, **options} if options and "url" not in options else options
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception, match=message):
        reader.load().count()


def test_a_schema_with_a_wrong_type_is_refused(spark: Any, db_url: str) -> None:
    with pytest.raises(Exception, match="column 'offset' of table 'messages' is bigint"):
        (spark.read.format("sqlqueue").option("url", db_url).schema("offset string")
         .load().count())
