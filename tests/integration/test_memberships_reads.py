"""The subscribers page reads every subscription's partitions, leases and heartbeats in a
number of statements that does not grow with the number of subscriptions: read a topic
at a time, 1,500 subscribed topics took 1.1-1.4 s a page (issue 52)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import PartitionLease, PartitionOffset, SubscriberHeartbeat
from sqlqueue.operations.subscribers import memberships

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 2_000_000_000_000  # far ahead of the database's clock: every stamp is fresh


def subscribed_topics(first: int, count: int) -> None:
    """``count`` topics of two partitions each, a group consuming each, one runner
    holding both partitions of each (its heartbeat fresh)."""
    for n in range(first, first + count):
        topic = f"t{n}"
        send_messages(topic, [OutgoingMessage(k, partition_key=f"k{k}") for k in range(2)])
        PartitionOffset.objects.bulk_create([
            PartitionOffset(consumer_group="g", topic=topic, partition_key=f"k{k}",
                            offset_acked=0, updated_at=NOW) for k in range(2)])
        PartitionLease.objects.bulk_create([
            PartitionLease(consumer_group="g", topic=topic, partition_key=f"k{k}",
                           leased_by="runner-1", leased_at=NOW, lease_renewed_at=NOW)
            for k in range(2)])
        SubscriberHeartbeat.objects.create(consumer_group="g", topic=topic,
                                           subscriber_name="runner-1", heartbeat_at=NOW)


def statements_of_memberships() -> tuple[int, list[tuple[str, int, int]]]:
    with CaptureQueriesContext(connection) as queries:
        found = memberships()
    # (The test app's own consumers are known subscriptions too.)
    return len(queries), [(m.topic, m.partitions, len(m.live)) for m in found
                          if m.group == "g"]


def test_the_reads_do_not_grow_with_the_subscriptions() -> None:
    subscribed_topics(0, 3)
    few, found = statements_of_memberships()
    assert found == [(f"t{n}", 2, 1) for n in range(3)]
    subscribed_topics(3, 27)
    many, found = statements_of_memberships()
    assert len(found) == 30 and all(partitions == 2 and live == 1
                                    for _, partitions, live in found)
    assert many == few, (few, many)
