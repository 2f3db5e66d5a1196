"""The reads of lag for many subscriptions at once (issue 52): with 1,500 subscribed topics,
reading each topic apart cost about eight statements a topic, and the lag overview,
``queue status``, ``queue health`` and ``/queue/metrics/`` 15 to 60 seconds.

``read_subscriptions`` reads, for every topic asked about, what ``lag.topic_lags`` needs
in a number of statements that does not grow with the number of topics: the heads of every
partition of the log (one loose index scan, ``log_heads``), every position, lease and
delivery state of the topics (one read of each small table), and later the pending
messages and dead letters of every lagging (group, partition) in statements planned once
for many probes (the store's ``pending_summaries`` and ``dead_letter_tallies``: see
docs/guides/monitoring.md, the cost of a scrape). A single topic (the lag page of one
group) reads its own heads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet

from sqlqueue.models import DeliveryState, PartitionLease, PartitionOffset
from sqlqueue.operations.lag_reads import StateCounts, TopicRead
from sqlqueue.storage.protocols import OperatorStore

#: partitions of the log ``log_heads`` reads at most; past it each topic's heads are read
#: apart (a log of that many partitions is read by a statement per topic anyway)
HEADS_READ = 100_000
#: topics a read of the small tables names in an IN list; more: the whole table is read
#: (it holds a row per group and partition: what the answer is made of anyway)
NAMED_TOPICS = 100

#: topic -> group -> partition -> a value
ByTopic = dict[str, dict[str, dict[str, Any]]]


@dataclass
class SubscriptionsRead:
    """What one read of many topics found."""

    now: int
    reads: dict[str, TopicRead]  # topic -> its heads and every group's positions
    leases: ByTopic  # (holder, ms since renewed)
    states: ByTopic  # StateCounts
    #: the topics of the log, when it was read whole (``log_heads``); None: not known
    log_topics: set[str] | None


def read_subscriptions(cursor: Any, store: OperatorStore, alias: str, topics: list[str],
                       groups: list[str], now: int,
                       heads: dict[str, int] | None = None) -> SubscriptionsRead:
    """The heads, positions, leases and delivery states of ``topics`` (sorted) for
    ``groups`` (the positions: of every group, for the count caps). ``heads``: of the
    one topic asked about, if already read."""
    if heads is not None and len(topics) == 1:
        by_topic, log_topics = {topics[0]: heads}, None
    else:
        by_topic, log_topics = read_heads(cursor, store, topics)
    reads = read_positions(alias, topics, now, by_topic)
    return SubscriptionsRead(now, reads, read_leases(alias, topics, groups, now),
                             delivery_summary(alias, topics, groups, now), log_topics)


def read_heads(cursor: Any, store: OperatorStore, topics: list[str]
               ) -> tuple[dict[str, dict[str, int]], set[str] | None]:
    """topic -> partition -> newest offset of ``topics`` (a topic not in the log: none),
    and the topics of the log when it was read whole (None: not known). One topic: its
    own heads; more: every partition of the log in one loose index scan, or each topic's
    apart past ``HEADS_READ`` partitions."""
    if len(topics) == 1:
        return {topics[0]: store.partition_heads(cursor, topics[0])}, None
    by_topic = store.log_heads(cursor, HEADS_READ)
    if sum(len(keys) for keys in by_topic.values()) < HEADS_READ:
        return by_topic, set(by_topic)
    return {t: store.partition_heads(cursor, t) for t in topics}, None


def of_topics(rows: QuerySet[Any], topics: list[str]) -> QuerySet[Any]:
    if len(topics) == 1:
        return rows.filter(topic=topics[0])
    return rows.filter(topic__in=topics) if len(topics) <= NAMED_TOPICS else rows


def read_positions(alias: str, topics: list[str], now: int,
                   heads: dict[str, dict[str, int]]) -> dict[str, TopicRead]:
    """Every group's positions on each of ``topics`` (one read), and the first pending
    offset each group's consumer saw (its hint); the count caps are left for the caller
    to set (``sqlqueue.operations.lag``)."""
    reads = {t: TopicRead(alias, t, now, heads.get(t, {}), {}, {}, None) for t in topics}
    for group, topic, key, acked, moved, hint in of_topics(
            PartitionOffset.objects.using(alias), topics).values_list(
            "consumer_group", "topic", "partition_key", "offset_acked", "updated_at",
            "first_pending"):
        read = reads.get(topic)
        if read is None:
            continue
        read.positions.setdefault(group, {})[key] = (int(acked), int(moved))
        if hint is not None and hint > acked:
            read.hints.setdefault(group, {})[key] = int(hint)
    return reads


def read_leases(alias: str, topics: list[str], groups: list[str], now: int) -> ByTopic:
    """topic -> group -> partition -> (holder, ms since its last renewal). A lease an
    operator's repair revoked has lease_renewed_at 0: no age (not 56 years)."""
    result: ByTopic = {}
    wanted = set(topics)
    for group, topic, key, owner, renewed in of_topics(
            PartitionLease.objects.using(alias).filter(consumer_group__in=groups),
            topics).values_list("consumer_group", "topic", "partition_key", "leased_by",
                                "lease_renewed_at"):
        if topic in wanted:
            result.setdefault(topic, {}).setdefault(group, {})[key] = (
                owner, now - renewed if renewed else None)
    return result


def delivery_summary(alias: str, topics: list[str], groups: list[str], now: int) -> ByTopic:
    """topic -> group -> partition -> its delivery states. Delivery state only exists
    above the watermark, so this reads the groups' working windows (primary-key
    prefix)."""
    rows = (of_topics(DeliveryState.objects.using(alias).filter(consumer_group__in=groups),
                       topics)
            .values("consumer_group", "topic", "partition_key")
            .annotate(in_flight=Count("message_offset", filter=Q(
                          acked=False, invisible_until__gt=now, last_error="")),
                      retrying=Count("message_offset", filter=Q(acked=False)
                                     & ~Q(last_error="")),
                      acked=Count("message_offset", filter=Q(acked=True)))
            .order_by())
    result: ByTopic = {}
    wanted = set(topics)
    for r in rows:
        if r["topic"] in wanted:
            result.setdefault(r["topic"], {}).setdefault(r["consumer_group"], {})[
                r["partition_key"]] = StateCounts(r["in_flight"], r["retrying"], r["acked"])
    return result
