"""Lag: where each consumer group stands on each partition of a topic, and a status.

Everything is read with bounded statements, so a page or command stays fast on big
tables: heads by a loose index scan (one seek per partition), watermarks, leases and
delivery states by primary-key prefix, and pending messages counted per partition up to
a cap. A count that reached its cap is reported as "at least". The cap per partition is
``COUNT_BUDGET`` shared among the partitions that lag, between ``MIN_PARTITION_CAP`` and
``COUNT_CAP``.

Status rules, per partition (in the spirit of Burrow: is there lag, and is the consumer
moving?):

* ``STOP``  - messages are pending and no live subscriber holds the partition's lease;
* ``STALL`` - messages are pending, the partition is held, but the watermark has not moved
  for ``STALL_AFTER`` seconds while the first pending message has been due that long;
* ``WARN``  - the first pending message has been due for more than ``WARN_AFTER``
  seconds (the group falls behind), or messages are retrying, or the partition has dead
  letters waiting for triage;
* ``OK``    - otherwise (nothing pending, or the group keeps up).

A paused subscription (``queue pause``, sqlqueue.operations.flow) is ``PAUSED`` instead of
``STALL``, ``WARN`` or ``OK``: it is not moving because an operator asked it not to. It is
still ``STOP`` when messages wait and no live subscriber holds the partition (nobody would
resume it).

A message scheduled for later (``deliver_after``) is not late before it is due. A
group's status is the worst of its partitions'.

The shapes (``PartitionLag``, ``GroupLag``, ``SEVERITY``) are in ``lag_shapes``; the
bounded reads in ``lag_reads``. This module holds the rules, the count caps and the entry
points (``group_lag``, ``topic_lags``, ``lag_overview``, ``known_subscriptions``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import PartitionOffset
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.flow import PauseRow, is_paused, pauses
from sqlqueue.operations.lag_many import SubscriptionsRead, read_subscriptions
from sqlqueue.operations.lag_reads import (
    Pending,
    TopicRead,
    first_messages_above,
    first_pending_only,
    partition_lag,
    pending_found,
    pending_probes,
    read_last_errors,
)

# Re-exported: the shapes are imported from here by callers and tests.
from sqlqueue.operations.lag_shapes import GroupLag as GroupLag
from sqlqueue.operations.lag_shapes import PartitionLag as PartitionLag
from sqlqueue.storage.protocols import OperatorStore
from sqlqueue.storage.sql.operating import PendingSummary

COUNT_BUDGET = 100_000  # index entries all the partitions of one group together may count
MIN_PARTITION_CAP = 100
WARN_AFTER = 60.0
STALL_AFTER = 300.0


def known_subscriptions(using: str | None = None) -> list[tuple[str, str]]:
    """Every (group, topic) that has registered with the database or in this process."""
    from sqlqueue.consuming.registry import registered_consumers

    alias = using or get_settings().DATABASE
    stored = set(PartitionOffset.objects.using(alias)
                 .values_list("consumer_group", "topic").distinct())
    stored |= {(c.group, c.topic) for c in registered_consumers()}
    return sorted(stored)


def lag_overview(using: str | None = None) -> list[GroupLag]:
    """``group_lag`` of every known subscription, by topic: every topic's heads,
    positions, leases and delivery states are read once for all (``lag_many``)."""
    return subscription_lags(known_subscriptions(using), using=using)


def group_lag(group: str, topic: str, using: str | None = None,
              heads: dict[str, int] | None = None, count_pending: bool = True,
              paused: list[PauseRow] | None = None) -> GroupLag:
    """Where ``group`` stands on every partition of ``topic``, with the last error of
    each partition's first retrying message. The same numbers as ``lag_overview`` and
    the metrics (the count budget is the topic's, whoever asks)."""
    return topic_lags(topic, [group], using=using, heads=heads, count_pending=count_pending,
                      paused=paused, last_errors=True)[0]


def topic_lags(topic: str, groups: list[str], using: str | None = None,
               heads: dict[str, int] | None = None, count_pending: bool = True,
               paused: list[PauseRow] | None = None, last_errors: bool = False
               ) -> list[GroupLag]:
    """``GroupLag`` of each of ``groups`` on ``topic``, in that order (``heads``: the
    topic's, if already read; ``paused``: the pauses, if already read)."""
    return subscription_lags([(group, topic) for group in groups], using=using, heads=heads,
                             count_pending=count_pending, paused=paused,
                             last_errors=last_errors)


def subscription_lags(subscriptions: list[tuple[str, str]], using: str | None = None,
                      heads: dict[str, int] | None = None, count_pending: bool = True,
                      paused: list[PauseRow] | None = None, last_errors: bool = False
                      ) -> list[GroupLag]:
    """``GroupLag`` of each (group, topic) of ``subscriptions``, sorted by topic, then in
    their order: a few statements for all the topics (``lag_many``), then the pending
    messages and dead letters of every lagging partition in statements of many probes
    each; only a topic with too many lagging partitions to count is probed apart."""
    if not subscriptions:
        return []
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    store = storage.store(connection)
    by_topic: dict[str, list[str]] = {}
    for group, topic in subscriptions:
        by_topic.setdefault(topic, []).append(group)
    topics = sorted(by_topic)
    paused = pauses(alias) if paused is None else paused
    with store.operator_reads(alias):
        with connection.cursor() as cursor:
            now = store.database_now_ms(cursor)
            found = read_subscriptions(cursor, store, alias, topics,
                                       sorted({g for g, _ in subscriptions}), now, heads)
        _set_caps(alias, found.reads)
        with connection.cursor() as cursor:
            pending = _pending(cursor, store, found, by_topic, count_pending)
            dead = store.dead_letter_tallies(cursor, [
                (t + conf.DLQ_SUFFIX, g) for t in topics for g in by_topic[t]
                # Read whole, the log shows which dead-letter topics have messages at all.
                if found.log_topics is None or t + conf.DLQ_SUFFIX in found.log_topics],
                COUNT_CAP)
    return [_group_lag(found, group, topic, pending.get((topic, group), {}),
                       dead.get((topic + conf.DLQ_SUFFIX, group), {}), count_pending,
                       is_paused(group, topic, alias, paused), last_errors)
            for topic in topics for group in by_topic[topic]]


def _set_caps(alias: str, reads: dict[str, TopicRead]) -> None:
    """Each topic's count cap, from the lagging partitions of every known group of the
    topic (so that every page and the metrics count the same)."""
    known: dict[str, set[str]] = {}
    for group, topic in known_subscriptions(alias):
        known.setdefault(topic, set()).add(group)
    for topic, read in reads.items():
        read.cap = _pair_cap(sum(len(read.lagging(g)) for g in known.get(topic, ())))


def _pending(cursor: Any, store: OperatorStore, found: SubscriptionsRead,
             by_topic: dict[str, list[str]], count: bool
             ) -> dict[tuple[str, str], dict[str, Pending]]:
    """(topic, group) -> partition -> its pending messages. The topics with a count cap:
    their lagging partitions in statements of many probes, one cap each; a topic past
    the count budget: its first messages above each watermark (``first_pending_only``)."""
    result: dict[tuple[str, str], dict[str, Pending]] = {}
    by_cap: dict[int | None, list[tuple[str, str, str, int]]] = {}
    for topic, groups in by_topic.items():
        read = found.reads[topic]
        if read.cap is None:
            lagging = [g for g in groups if read.lagging(g)]
            if lagging:
                read.firsts = first_messages_above(cursor, store, read, groups)
            for g in lagging:
                result[topic, g] = first_pending_only(
                    cursor, store, read, g, read.lagging(g),
                    found.states.get(topic, {}).get(g, {}))
            continue
        for group in groups:
            by_cap.setdefault(read.cap if count else None, []).extend(
                pending_probes(read, group))
    summaries = {}
    for cap, probes in by_cap.items():
        summaries.update(store.pending_summaries(cursor, probes, cap))
    mine: dict[tuple[str, str], dict[str, PendingSummary]] = {}
    for (topic, group, key), summary in summaries.items():
        mine.setdefault((topic, group), {})[key] = summary
    for (topic, group), partitions in mine.items():
        result[topic, group] = pending_found(found.reads[topic], partitions,
                                             found.states.get(topic, {}).get(group, {}))
    return result


def _group_lag(found: SubscriptionsRead, group: str, topic: str, pending: dict[str, Pending],
               dead: dict[str, int], count_pending: bool, paused: bool,
               last_errors: bool) -> GroupLag:
    """Where ``group`` stands on every partition of ``topic``, from what was read."""
    conf = get_settings()
    read = found.reads[topic]
    mine = found.states.get(topic, {}).get(group, {})
    leases = found.leases.get(topic, {}).get(group, {})
    errors = (read_last_errors(read.alias, group, topic)
              if last_errors and any(s.retrying for s in mine.values()) else {})
    lag = GroupLag(group, topic, sum(dead.values()), paused=paused)
    keys = set(read.heads) | set(read.positions.get(group, {})) | set(dead) | set(leases)
    for key in sorted(keys):
        partition = partition_lag(read, group, key, pending.get(key), mine.get(key),
                                  leases.get(key), dead.get(key, 0), count_pending,
                                  conf.LEASE_DURATION)
        partition.last_error = errors.get(key, "")
        partition.status = partition_status(partition, lag.paused)
        lag.partitions.append(partition)
    return lag


def _pair_cap(lagging_pairs: int) -> int | None:
    """The cap of each lagging partition's count: ``COUNT_BUDGET`` index entries shared
    by every lagging (group, partition) of a topic, between ``MIN_PARTITION_CAP`` and
    ``COUNT_CAP``. None beyond ``COUNT_BUDGET // MIN_PARTITION_CAP`` lagging pairs:
    counting each would cost a probe per pair (the cost of a scrape, not the entries
    read), so each is known to hold at least one."""
    if not lagging_pairs:
        return COUNT_CAP
    if lagging_pairs > COUNT_BUDGET // MIN_PARTITION_CAP:
        return None
    return max(MIN_PARTITION_CAP, min(COUNT_CAP, COUNT_BUDGET // lagging_pairs))


def partition_status(p: PartitionLag, paused: bool = False) -> str:
    """The documented rules (module docstring)."""
    due_for = p.oldest_pending_age or 0.0
    if p.lagging and not p.leased_by:
        return "STOP"
    if paused:
        return "PAUSED"
    if (p.lagging and p.watermark_age is not None and p.watermark_age > STALL_AFTER
            and due_for > STALL_AFTER):
        return "STALL"
    if due_for > WARN_AFTER or p.retrying or p.dead_letters:
        return "WARN"
    return "OK"
