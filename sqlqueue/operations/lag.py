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

A message scheduled for later (``deliver_after``) is not late before it is due. A
group's status is the worst of its partitions'.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connections
from django.db.models import Count, Q

from sqlqueue.conf import get_settings
from sqlqueue.models import DeliveryState, PartitionLease, PartitionOffset
from sqlqueue.storage.sql import dialect_for

COUNT_CAP = 10_000  # the most any one count reads
COUNT_BUDGET = 100_000  # index entries all the partitions of one group together may count
MIN_PARTITION_CAP = 100
WARN_AFTER = 60.0
STALL_AFTER = 300.0
SEVERITY = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3}


@dataclass
class PartitionLag:
    partition_key: str
    head_offset: int
    watermark: int
    lagging: bool  # a message for this group is stored above the watermark
    pending: int | None  # messages above the watermark, up to ``pending_cap`` (None: not
    # counted, in the overview)
    in_flight: int  # first attempt running (not yet failed)
    retrying: int  # failed at least once, not yet acked: backing off or on a later attempt
    dead_letters: int  # of this group, from this partition, waiting for triage
    oldest_pending_age: float | None  # seconds the first pending message has been due
    leased_by: str  # the live holder, or "" (nobody holds it)
    lease_age: float | None  # seconds since the lease was last renewed
    watermark_age: float | None  # seconds since the watermark last moved
    pending_cap: int = COUNT_CAP
    status: str = "OK"

    @property
    def pending_capped(self) -> bool:
        return self.pending is not None and self.pending >= self.pending_cap


@dataclass
class GroupLag:
    group: str
    topic: str
    dead_letters: int  # counted up to COUNT_CAP
    partitions: list[PartitionLag] = field(default_factory=list)

    @property
    def status(self) -> str:
        return worst(p.status for p in self.partitions)

    @property
    def pending(self) -> int:
        return sum(p.pending or 0 for p in self.partitions)

    @property
    def lagging(self) -> int:
        return sum(1 for p in self.partitions if p.lagging)

    @property
    def pending_capped(self) -> bool:
        return any(p.pending_capped for p in self.partitions)

    @property
    def in_flight(self) -> int:
        return sum(p.in_flight for p in self.partitions)

    @property
    def retrying(self) -> int:
        return sum(p.retrying for p in self.partitions)

    @property
    def dead_letters_capped(self) -> bool:
        return self.dead_letters >= COUNT_CAP

    @property
    def held(self) -> int:
        return sum(1 for p in self.partitions if p.leased_by)

    @property
    def holders(self) -> set[str]:
        return {p.leased_by for p in self.partitions if p.leased_by}

    @property
    def oldest_pending_age(self) -> float | None:
        ages = [p.oldest_pending_age for p in self.partitions if p.oldest_pending_age is not None]
        return max(ages) if ages else None

    def partition(self, key: str) -> PartitionLag | None:
        return next((p for p in self.partitions if p.partition_key == key), None)


def worst(statuses: Iterable[str]) -> str:
    return max(statuses, key=SEVERITY.__getitem__, default="OK")


def known_subscriptions(using: str | None = None) -> list[tuple[str, str]]:
    """Every (group, topic) that has registered with the database or in this process."""
    from sqlqueue.consuming.registry import registered_consumers

    alias = using or get_settings().DATABASE
    stored = set(PartitionOffset.objects.using(alias)
                 .values_list("consumer_group", "topic").distinct())
    stored |= {(c.group, c.topic) for c in registered_consumers()}
    return sorted(stored)


def lag_overview(using: str | None = None) -> list[GroupLag]:
    """``group_lag`` of every known subscription, reading each topic's heads once and
    counting nothing (statuses need only where each lagging partition's first pending
    message is)."""
    heads: dict[str, dict[str, int]] = {}
    result = []
    for group, topic in known_subscriptions(using):
        if topic not in heads:
            heads[topic] = _heads(topic, using)
        result.append(group_lag(group, topic, using=using, heads=heads[topic],
                                count_pending=False))
    return result


def group_lag(group: str, topic: str, using: str | None = None,
              heads: dict[str, int] | None = None, count_pending: bool = True) -> GroupLag:
    """Where ``group`` stands on every partition of ``topic``: a few statements, one
    bounded probe per lagging partition, whatever the number of messages."""
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        now = dialect.database_now_ms(cursor)
        if heads is None:
            heads = dialect.partition_heads(cursor, topic)
        dead = dialect.dead_letter_counts(cursor, topic + conf.DLQ_SUFFIX, group, COUNT_CAP)
        offsets = {key: (int(acked), int(updated)) for key, acked, updated in
                   PartitionOffset.objects.using(alias)
                   .filter(consumer_group=group, topic=topic)
                   .values_list("partition_key", "offset_acked", "updated_at")}
        keys = sorted(set(heads) | set(offsets) | set(dead))
        lagging = {key: offsets.get(key, (0, 0))[0] for key in keys
                   if heads.get(key, 0) > offsets.get(key, (0, 0))[0]}
        cap = _partition_cap(len(lagging))
        pending = dialect.pending_summary(cursor, topic, group, lagging,
                                          cap if count_pending else None)
    leases = {key: (owner, now - renewed) for key, owner, renewed in
              PartitionLease.objects.using(alias).filter(consumer_group=group, topic=topic)
              .values_list("partition_key", "leased_by", "lease_renewed_at")}
    states = _delivery_summary(alias, group, topic, now)
    lease_ms = round(conf.LEASE_DURATION * 1000)

    result = GroupLag(group, topic, sum(dead.values()))
    for key in sorted(set(keys) | set(leases)):
        watermark, updated_at = offsets.get(key, (0, 0))
        summary = pending.get(key)
        owner, lease_age_ms = leases.get(key, ("", None))
        in_flight, retrying = states.get(key, (0, 0))
        partition = PartitionLag(
            partition_key=key,
            head_offset=max(heads.get(key, 0), watermark),
            watermark=watermark,
            lagging=summary is not None and summary.oldest_due_at is not None,
            pending=(summary.count if summary else 0) if count_pending else None,
            in_flight=in_flight,
            retrying=retrying,
            dead_letters=dead.get(key, 0),
            oldest_pending_age=(None if summary is None or summary.oldest_due_at is None
                                else max(0.0, (now - summary.oldest_due_at) / 1000)),
            leased_by=owner if lease_age_ms is not None and lease_age_ms < lease_ms else "",
            lease_age=None if lease_age_ms is None else lease_age_ms / 1000,
            watermark_age=(now - updated_at) / 1000 if key in offsets else None,
            pending_cap=cap,
        )
        partition.status = partition_status(partition)
        result.partitions.append(partition)
    return result


def _heads(topic: str, using: str | None) -> dict[str, int]:
    connection = connections[using or get_settings().DATABASE]
    with connection.cursor() as cursor:
        return dialect_for(connection).partition_heads(cursor, topic)


def _partition_cap(lagging_partitions: int) -> int:
    if not lagging_partitions:
        return COUNT_CAP
    return max(MIN_PARTITION_CAP, min(COUNT_CAP, COUNT_BUDGET // lagging_partitions))


def _delivery_summary(alias: str, group: str, topic: str, now: int
                      ) -> dict[str, tuple[int, int]]:
    """Per partition: (in flight on a first attempt, retrying). Delivery state only
    exists above the watermark, so this reads the group's working window."""
    rows = (DeliveryState.objects.using(alias)
            .filter(consumer_group=group, topic=topic, acked=False)
            .values("partition_key")
            .annotate(in_flight=Count("message_offset",
                                      filter=Q(invisible_until__gt=now, last_error="")),
                      retrying=Count("message_offset", filter=~Q(last_error="")))
            .order_by())
    return {r["partition_key"]: (r["in_flight"], r["retrying"]) for r in rows}


def partition_status(p: PartitionLag) -> str:
    """The documented rules (module docstring)."""
    due_for = p.oldest_pending_age or 0.0
    if p.lagging and not p.leased_by:
        return "STOP"
    if (p.lagging and p.watermark_age is not None and p.watermark_age > STALL_AFTER
            and due_for > STALL_AFTER):
        return "STALL"
    if due_for > WARN_AFTER or p.retrying or p.dead_letters:
        return "WARN"
    return "OK"
