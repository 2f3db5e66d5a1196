"""Streaming reads: new messages, late commits, restarts, and consumer groups."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.conf import get_settings
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.integrations.spark.connect import Database
from sqlqueue.models import PartitionLease, PartitionOffset, QueueMessage, SubscriberHeartbeat
from sqlqueue.operations.lag import group_lag
from sqlqueue.storage.sql import store_for
from tests.spark.conftest import Collector, wait_until

TRIGGER = "200 milliseconds"


def start(streams: Callable[..., Any], spark: Any, db_url: str, sink: Collector,
          checkpoint: Path, **options: str) -> Any:
    # The MariaDB of a shared machine may have other long transactions open: do not wait
    # on them for the default five minutes.
    reader = (spark.readStream.format("sqlqueue").option("url", db_url)
              .option("maxTransactionAge", "20"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return streams(reader.load().writeStream.foreachBatch(sink)
                   .option("checkpointLocation", str(checkpoint)).trigger(processingTime=TRIGGER))


def publish(topic: str, *ids: str, partitions: int = 1) -> list[int]:
    sent = send_messages(topic, [OutgoingMessage({"id": i}, id=i,
                                                 partition_key=f"p{n % partitions}")
                                 for n, i in enumerate(ids)])
    return [s.offset for s in sent]


def test_the_stream_picks_up_new_messages(spark: Any, db_url: str, streams: Any,
                                          tmp_path: Path) -> None:
    publish("live", "a", "b", "c")
    send_message("elsewhere", {"not": "this topic"})
    sink = Collector()
    query = start(streams, spark, db_url, sink, tmp_path / "cp", topic="live")
    wait_until(lambda: len(sink.rows) >= 3, "the first three messages", query)
    publish("live", "d", "e")
    wait_until(lambda: len(sink.rows) >= 5, "two more messages", query)
    assert sink.ids() == ["a", "b", "c", "d", "e"]
    offsets = [row["offset"] for row in sink.rows]
    assert offsets == sorted(offsets)


def test_a_restart_from_the_checkpoint_replays_nothing(spark: Any, db_url: str, streams: Any,
                                                       tmp_path: Path) -> None:
    checkpoint = tmp_path / "cp"
    publish("live", *[f"first-{n}" for n in range(5)])
    first = Collector()
    query = start(streams, spark, db_url, first, checkpoint, topic="live")
    wait_until(lambda: len(first.rows) >= 5 and all_committed(checkpoint),
               "the first five, committed to the checkpoint", query)
    query.stop()
    publish("live", *[f"second-{n}" for n in range(3)])
    second = Collector()
    query = start(streams, spark, db_url, second, checkpoint, topic="live")
    # A replay would come first, in the restarted query's first batch.
    wait_until(lambda: len(second.rows) >= 3, "the three published while stopped", query)
    assert second.ids() == ["second-0", "second-1", "second-2"]
    assert first.ids() == [f"first-{n}" for n in range(5)]


def all_committed(checkpoint: Path) -> bool:
    """Every planned micro-batch is in the checkpoint's commit log (stopping before that
    would make Spark run the last one again after a restart: at least once)."""
    def batches(folder: str) -> set[str]:
        path = checkpoint / folder
        return {p.name for p in path.iterdir() if p.name.isdigit()} if path.exists() else set()

    planned = batches("offsets")
    return bool(planned) and planned <= batches("commits")


def _progress_after(query: Any, moment_ms: int) -> bool:
    for progress in query.recentProgress:
        at = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
        if at.astimezone(UTC).timestamp() * 1000 > moment_ms:
            return True
    return False


def test_the_stream_holds_back_behind_an_open_publishing_transaction(
        spark: Any, db_url: str, streams: Any, tmp_path: Path, mysql_only: None) -> None:
    """A transaction inserts a message and stays open: its offset is allocated, its row
    invisible. A message committed after it must not be streamed before it, or the
    stream's checkpoint would move past the late one and lose it (guarantee I4)."""
    publish("live", "before")
    sink = Collector()
    query = start(streams, spark, db_url, sink, tmp_path / "cp", topic="live")
    wait_until(lambda: sink.ids() == ["before"], "the first message", query)

    late = Database.from_url(db_url).connect()
    try:
        late.run((late.sql.begin_sql, []))
        late.run(late.sql.store_new_messages("live", [("p0", "late", '{"id": "late"}', None,
                                                    1, 50, 0)]))
        (after,) = publish("live", "after")
        with connection.cursor() as cursor:
            committed_ms = store_for(connection).database_now_ms(cursor)
        # Give the stream time to have planned well past "after" had it not waited:
        # two seconds of database time (the settling margin is one), then a trigger.
        wait_until(lambda: _db_now() > committed_ms + 2000 and _progress_after(
            query, committed_ms + 2000), "two seconds of triggers", query)
        assert sink.ids() == ["before"]
        late.raw.commit()
    finally:
        late.close()
    wait_until(lambda: len(sink.rows) >= 3, "the late message and the one after it", query)
    assert sink.ids() == ["before", "late", "after"]  # offset order: late was allocated first
    assert sink.rows[2]["offset"] == after


def _db_now() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


# -- consumer groups ---------------------------------------------------------------------

def test_a_consumer_group_stream_acks_what_it_committed(spark: Any, db_url: str, streams: Any,
                                                        tmp_path: Path) -> None:
    offsets = publish("billing", *[f"m{n}" for n in range(6)], partitions=3)
    # A replay addressed to another group: not for this one.
    QueueMessage.objects.create(topic="billing", partition_key="p0", id="replay", payload=b"{}",
                                created_at=1, published_at=1, consumer_group="someone-else")
    sink = Collector()
    query = start(streams, spark, db_url, sink, tmp_path / "cp", topic="billing",
                  consumerGroup="spark-billing", leaseDuration="30", leaseRenewInterval="1")
    wait_until(lambda: len(sink.rows) >= 6, "the six messages", query)
    last = max(offsets)

    def acked() -> dict[str, int]:
        marks = dict(PartitionOffset.objects.filter(consumer_group="spark-billing")
                     .values_list("partition_key", "offset_acked"))
        return marks if marks and min(marks.values()) >= last else {}

    marks = wait_until(acked, "the group's watermarks to pass the batch", query)
    assert set(marks) == {"p0", "p1", "p2"}
    assert sorted(sink.ids()) == [f"m{n}" for n in range(6)]
    lag = group_lag("spark-billing", "billing")
    assert lag.pending == 0
    leases = set(PartitionLease.objects.filter(consumer_group="spark-billing")
                 .values_list("partition_key", "leased_by"))
    assert leases == {(p, "spark:spark-billing") for p in ("p0", "p1", "p2")}
    assert SubscriberHeartbeat.objects.filter(subscriber_name="spark:spark-billing").exists()

    # The group is a known group of the topic: garbage collection follows its watermarks.
    collector = GarbageCollector(get_settings(), "default", {"billing": set()})
    with connections["default"].cursor() as cursor:
        collector.collect(cursor, force=True)
    assert not QueueMessage.objects.filter(topic="billing").exists()


def test_a_consumer_group_stream_must_be_the_only_member(spark: Any, db_url: str,
                                                         streams: Any, tmp_path: Path) -> None:
    publish("billing", "m0")
    with connection.cursor() as cursor:
        store_for(connection).heartbeat(cursor, "billing-group", "billing", "worker-1")
    sink = Collector()
    query = start(streams, spark, db_url, sink, tmp_path / "cp", topic="billing",
                  consumerGroup="billing-group")
    with pytest.raises(Exception, match="must be the only one"):
        query.awaitTermination(120)
    assert sink.rows == []
    assert not PartitionOffset.objects.filter(consumer_group="billing-group").exists()


def test_available_now_reads_what_is_settled_and_stops(spark: Any, db_url: str, streams: Any,
                                                       tmp_path: Path) -> None:
    publish("live", "a", "b", "c")
    newest = QueueMessage.objects.order_by("-offset").values_list("created_at", flat=True)[0]
    # Rows of the last second are not settled yet on MySQL/MariaDB: wait them out.
    wait_until(lambda: _db_now() > newest + 1500, "the rows to settle")
    sink = Collector()
    query = streams(spark.readStream.format("sqlqueue").option("url", db_url)
                    .option("topic", "live").option("maxRowsPerTrigger", "2").load()
                    .writeStream.foreachBatch(sink)
                    .option("checkpointLocation", str(tmp_path / "cp"))
                    .trigger(availableNow=True))
    assert query.awaitTermination(120)
    assert sink.ids() == ["a", "b", "c"]
    assert [len(batch) for batch in sink.batches] == [2, 1]  # maxRowsPerTrigger holds
