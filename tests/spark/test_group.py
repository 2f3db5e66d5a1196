"""The consumer group of a stream, without Spark: leases, fencing, acks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from pyspark.sql.streaming.datasource import ReadAllAvailable

from sqlqueue import send_message
from sqlqueue.integrations.spark.connect import Connection
from sqlqueue.integrations.spark.errors import GroupNotExclusive
from sqlqueue.integrations.spark.group import ConsumerGroup
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.models import PartitionLease, PartitionOffset
from sqlqueue.storage.sql import store_for


@pytest.fixture
def group(db_url: str) -> Iterator[tuple[ConsumerGroup, Connection]]:
    options = SourceOptions.parse({"url": db_url, "topic": "t", "consumerGroup": "g",
                                   "leaseDuration": "30", "leaseRenewInterval": "10"})
    with options.database.connect() as db:
        yield ConsumerGroup(options), db


def head() -> int:
    return send_message("t", {"n": 1}, partition_key="b").offset


def leases() -> dict[str, tuple[str, int]]:
    return {lease.partition_key: (lease.leased_by, lease.generation)
            for lease in PartitionLease.objects.filter(consumer_group="g")}


def test_register_takes_every_partition_and_creates_the_watermarks(group: tuple) -> None:
    stream, db = group
    send_message("t", {"n": 0}, partition_key="a")
    last = head()
    stream.register(db, start=1, head=last)
    assert leases() == {"a": ("spark:g", 1), "b": ("spark:g", 1)}
    marks = dict(PartitionOffset.objects.filter(consumer_group="g")
                 .values_list("partition_key", "offset_acked"))
    assert marks == {"a": 0, "b": 0}
    stream.ack_below(db, last + 1)
    marks = dict(PartitionOffset.objects.filter(consumer_group="g")
                 .values_list("partition_key", "offset_acked"))
    assert marks == {"a": last, "b": last}
    assert stream.position(db) == last + 1


def test_lapsed_leases_nobody_took_are_kept(group: tuple) -> None:
    stream, db = group
    last = head()
    stream.register(db, start=1, head=last)
    PartitionLease.objects.filter(consumer_group="g").update(lease_renewed_at=0)
    stream.tick(db, last, force=True)
    assert leases() == {"b": ("spark:g", 1)}  # still ours, at the same generation
    assert PartitionLease.objects.get(consumer_group="g").lease_renewed_at > 0
    stream.ack_below(db, last + 1)  # and the acks go on


def test_a_lease_taken_by_another_subscriber_stops_the_stream(group: tuple) -> None:
    stream, db = group
    last = head()
    stream.register(db, start=1, head=last)
    PartitionLease.objects.filter(consumer_group="g").update(lease_renewed_at=0)
    with connection.cursor() as cursor:  # a runconsumer worker takes the lapsed lease
        store_for(connection).acquire_leases(cursor, "g", "t", ["b"], "worker", 30_000)
    with pytest.raises(GroupNotExclusive, match=r"held by other subscribers: b \(worker\)"):
        stream.ack_below(db, last + 1)
    assert PartitionOffset.objects.get(consumer_group="g").offset_acked == 0  # no ack


def test_a_lease_that_changed_hands_in_between_stops_the_stream(group: tuple) -> None:
    stream, db = group
    last = head()
    stream.register(db, start=1, head=last)
    # Someone took it and gave it back meanwhile: the generation moved on by two.
    PartitionLease.objects.filter(consumer_group="g").update(generation=3, lease_renewed_at=0)
    with pytest.raises(GroupNotExclusive, match="changed hands"):
        stream.tick(db, last, force=True)


def test_another_live_member_stops_the_stream(group: tuple) -> None:
    stream, db = group
    last = head()
    stream.register(db, start=1, head=last)
    with connection.cursor() as cursor:
        store_for(connection).heartbeat(cursor, "g", "t", "worker-2")
    with pytest.raises(GroupNotExclusive, match=r"other live subscribers \(worker-2\)"):
        stream.tick(db, last, force=True)


def test_leave_hands_everything_back(group: tuple) -> None:
    stream, db = group
    last = head()
    stream.register(db, start=1, head=last)
    stream.leave(db)
    assert leases() == {}


def test_a_paused_group_stream_plans_nothing_new(db_url: str) -> None:
    """The stream's planning on the driver (no Spark needed): while the group is paused,
    latestOffset offers nothing past the start; once resumed, it offers the new rows."""
    from sqlqueue.integrations.spark.stream import LogStreamReader
    from sqlqueue.operations import flow
    from tests.acceptance.processes import wait_for

    options = SourceOptions.parse({"url": db_url, "topic": "t", "consumerGroup": "g"})
    reader = LogStreamReader(options, [])
    last = head()
    flow.pause("g", "t")
    assert reader.latestOffset({"offset": 1}, ReadAllAvailable()) == {"offset": 1}
    assert PartitionLease.objects.filter(consumer_group="g").count() == 1  # still held
    flow.resume("g", "t")
    reader._pauses._next_read = 0.0  # type: ignore[union-attr]  # next read now
    # (the write horizon may hold the newest row back for a moment on MySQL)
    wait_for(lambda: reader.latestOffset({"offset": 1}, ReadAllAvailable())
             == {"offset": last + 1}, timeout=10, what="the offset after the resume")
    reader.stop()
