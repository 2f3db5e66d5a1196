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

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import PartitionOffset
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.flow import PauseRow, is_paused, pauses
from sqlqueue.operations.lag_reads import (
    TopicRead,
    delivery_summary,
    first_messages_above,
    partition_lag,
    pending_messages,
    read_last_errors,
    read_leases,
    read_positions,
)

# Re-exported: the shapes are imported from here by callers and tests.
from sqlqueue.operations.lag_shapes import GroupLag as GroupLag
from sqlqueue.operations.lag_shapes import PartitionLag as PartitionLag

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
    """``group_lag`` of every known subscription, one topic at a time: each topic's
    heads, positions, leases and delivery states are read once for all its groups."""
    paused = pauses(using)
    by_topic: dict[str, list[str]] = {}
    for group, topic in known_subscriptions(using):
        by_topic.setdefault(topic, []).append(group)
    return [lag for topic, groups in sorted(by_topic.items())
            for lag in topic_lags(topic, groups, using=using, paused=paused)]


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
    """``GroupLag`` of each of ``groups`` on ``topic``, in that order: a few statements
    for the topic, then one bounded probe per lagging partition. ``paused``: the pauses,
    if already read."""
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    store = storage.store(connection)
    with connection.cursor() as cursor:
        now = store.database_now_ms(cursor)
        if heads is None:
            heads = store.partition_heads(cursor, topic)
    read = _read_topic(alias, topic, now, heads)
    leases = read_leases(alias, topic, groups, now)
    states = delivery_summary(alias, topic, groups, now)
    if read.cap is None:
        with connection.cursor() as cursor:
            read.firsts = first_messages_above(cursor, store, read, groups)
    result = []
    for group in groups:
        with connection.cursor() as cursor:
            dead = store.dead_letter_counts(cursor, topic + conf.DLQ_SUFFIX, group, COUNT_CAP)
            pending = pending_messages(cursor, store, read, group,
                                       states.get(group, {}), count_pending)
        mine = states.get(group, {})
        errors = (read_last_errors(alias, group, topic)
                  if last_errors and any(s.retrying for s in mine.values()) else {})
        lag = GroupLag(group, topic, sum(dead.values()),
                       paused=is_paused(group, topic, alias, paused))
        keys = set(heads) | set(read.positions.get(group, {})) | set(dead)
        for key in sorted(keys | set(leases.get(group, {}))):
            partition = partition_lag(read, group, key, pending.get(key), mine.get(key),
                                      leases.get(group, {}).get(key), dead.get(key, 0),
                                      count_pending, conf.LEASE_DURATION)
            partition.last_error = errors.get(key, "")
            partition.status = partition_status(partition, lag.paused)
            lag.partitions.append(partition)
        result.append(lag)
    return result


def _read_topic(alias: str, topic: str, now: int, heads: dict[str, int]) -> TopicRead:
    """Every group's positions on the topic (one read by ``idx_topic_partition``), and
    the count cap, from the lagging partitions of every known group of the topic (so
    that every page and the metrics count the same)."""
    read = read_positions(alias, topic, now, heads)
    known = {g for g, t in known_subscriptions(alias) if t == topic}
    read.cap = _pair_cap(sum(len(read.lagging(group)) for group in known))
    return read


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
