"""The lag of many subscribed topics in a number of statements that does not grow with the
number of topics (issue 52: with 1,500 topics each subscribed by a group, the lag
overview, ``queue status``, ``queue health`` and ``/queue/metrics/`` read each topic
apart, about eight statements a topic, and took 15 to 60 seconds at 2 million messages);
and the same numbers as the lag of one group on one topic."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from sqlqueue.models import PartitionLease, PartitionOffset, QueueMessage
from sqlqueue.operations.lag import GroupLag, group_lag, lag_overview
from sqlqueue.operations.state import subscription_states
from tests.integration.test_admin import admin_client

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client"]


def make(topics: int) -> None:
    """``topics`` topics of two partitions and three messages, each subscribed by group
    ``g`` (acked past the first message of partition a), every third with a dead letter
    of ``g``, every fourth with a lease; a second group on the first topic."""
    QueueMessage.objects.all().delete()
    PartitionOffset.objects.all().delete()
    PartitionLease.objects.all().delete()
    names = [f"t{n:04}" for n in range(topics)]
    QueueMessage.objects.bulk_create(
        [QueueMessage(topic=t, partition_key=k, id=f"{t}-{k}{i}", payload=b"{}",
                      created_at=1, published_at=1)
         for t in names for k, i in (("a", 0), ("a", 1), ("b", 0))]
        + [QueueMessage(topic=f"{t}_dlq", partition_key="a", id=f"{t}-d", payload=b"{}",
                        created_at=1, published_at=1, consumer_group="g", original_topic=t,
                        failure_count=1, last_error="no") for t in names[::3]],
        batch_size=500)
    first = dict(QueueMessage.objects.filter(partition_key="a", id__endswith="a0")
                 .values_list("topic", "offset"))
    PartitionOffset.objects.bulk_create(
        [PartitionOffset(consumer_group="g", topic=t, partition_key="a", offset_acked=first[t],
                         updated_at=1) for t in names]
        + [PartitionOffset(consumer_group="h", topic=names[0], partition_key="b",
                           offset_acked=0, updated_at=1)], batch_size=500)
    PartitionLease.objects.bulk_create(
        [PartitionLease(consumer_group="g", topic=t, partition_key="a", leased_by="r1",
                        leased_at=1, lease_renewed_at=1, generation=1) for t in names[::4]],
        batch_size=500)


def statements_of(read: Callable[[], object]) -> int:
    with CaptureQueriesContext(connection) as captured:
        read()
    return len(captured.captured_queries)


def numbers(lag: GroupLag) -> list[tuple[object, ...]]:
    """What a lag says of each partition, but the ages (of a later clock reading)."""
    return [(p.partition_key, p.head_offset, p.watermark, p.lagging, p.pending,
             p.pending_capped, p.in_flight, p.retrying, p.dead_letters, p.leased_by,
             p.status) for p in lag.partitions]


def test_lag_of_many_topics_takes_as_many_statements_as_of_a_few(
        admin_client: Client) -> None:
    def status() -> None:
        call_command("queue", "status", stdout=io.StringIO())

    def scrape() -> None:
        assert admin_client.get(reverse("sqlqueue:metrics")).status_code == 200

    reads = [lag_overview, subscription_states, status, scrape]
    make(4)
    few = [statements_of(read) for read in reads]
    make(450)  # past one statement's 200 probes, and past the topics named in an IN list
    many = [statements_of(read) for read in reads]
    # Up to two statements more per read: the probes of 450 topics' lagging partitions
    # and their dead letters need three statements of 200 where 4 topics need one.
    assert all(m <= f + 4 for m, f in zip(many, few, strict=True)), (few, many)


def test_the_overview_counts_what_each_group_lag_counts() -> None:
    make(7)
    # (Consumers registered in this process by other tests are known subscriptions too.)
    overview = {(lag.group, lag.topic): lag for lag in lag_overview()
                if lag.group in ("g", "h")}
    assert len(overview) == 8
    for (group, topic), lag in overview.items():
        alone = group_lag(group, topic)
        assert numbers(lag) == numbers(alone), (group, topic)
        assert (lag.dead_letters, lag.status, lag.pending) == (
            alone.dead_letters, alone.status, alone.pending)
    t0 = overview["g", "t0000"]
    assert t0.dead_letters == 1 and t0.pending == 2
    assert {p.partition_key: p.pending for p in t0.partitions} == {"a": 1, "b": 1}
    assert overview["g", "t0001"].dead_letters == 0
    assert overview["h", "t0000"].pending == 3


def overview_rows(page: str) -> int:
    table = page.split('id="sqlqueue-lag-overview"', 1)[1].split("</table>", 1)[0]
    return table.count('<tr class="row')


def test_the_overview_lists_the_worst_first_a_page_at_a_time(admin_client: Client) -> None:
    from sqlqueue.admin.lag import OVERVIEW_ROWS
    from sqlqueue.operations.lag import known_subscriptions

    make(450)
    total = len(known_subscriptions())
    pages = -(-total // OVERVIEW_ROWS)
    url = reverse("admin:sqlqueue_consumerlag_changelist")
    first = admin_client.get(url).content.decode()
    assert f"{total} subscriptions" in first and f"page 1 of {pages}" in first
    assert overview_rows(first) == OVERVIEW_ROWS and "?page=2" in first
    last = admin_client.get(f"{url}?page={pages}").content.decode()
    assert overview_rows(last) == total - OVERVIEW_ROWS * (pages - 1)
    assert "next page" not in last and f"?page={pages - 1}" in last
    # Past the last page: the last; not a number: the first.
    assert overview_rows(admin_client.get(f"{url}?page=99").content.decode()) == \
        overview_rows(last)
    assert f"page 1 of {pages}" in admin_client.get(f"{url}?page=x").content.decode()
    # Worst first: the STOP subscriptions (nobody holds a lagging partition) first.
    assert "STOP" in first.split('id="sqlqueue-lag-overview"', 1)[1].split("</tr>", 2)[1]
