"""Lag: where each consumer group stands on each partition of a topic, and a status.

Counts are capped (``COUNT_CAP``) so that a page or command stays fast on big tables: a
count that reached the cap is reported as "at least". Status rules, per partition:

* ``STOP``  - messages are pending and no live subscriber holds the partition's lease;
* ``STALL`` - messages are pending, the partition is held, but the watermark has not moved
  for ``STALL_AFTER`` seconds;
* ``WARN``  - the oldest pending message is older than ``WARN_AFTER`` seconds, or messages
  are retrying, or some were dead-lettered;
* ``OK``    - otherwise (nothing pending, or the group keeps up).

A group's status is the worst of its partitions'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connections

from sqlqueue.conf import get_settings
from sqlqueue.models import DeliveryState, PartitionLease, PartitionOffset, QueueMessage
from sqlqueue.storage.sql import dialect_for

COUNT_CAP = 10_000
WARN_AFTER = 60.0
STALL_AFTER = 300.0
SEVERITY = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3}


@dataclass
class PartitionLag:
    partition_key: str
    head_offset: int
    watermark: int
    pending: int  # capped at COUNT_CAP
    in_flight: int
    retrying: int
    oldest_pending_age: float | None  # seconds
    leased_by: str
    lease_age: float | None  # seconds since the last renewal
    watermark_age: float | None  # seconds since the watermark last moved
    status: str = "OK"

    @property
    def pending_capped(self) -> bool:
        return self.pending >= COUNT_CAP


@dataclass
class GroupLag:
    group: str
    topic: str
    dead_letters: int
    partitions: list[PartitionLag] = field(default_factory=list)

    @property
    def status(self) -> str:
        statuses = [p.status for p in self.partitions] or ["OK"]
        return max(statuses, key=SEVERITY.__getitem__)

    @property
    def pending(self) -> int:
        return sum(p.pending for p in self.partitions)


def known_subscriptions(using: str | None = None) -> list[tuple[str, str]]:
    """Every (group, topic) that has registered with the database or in this process."""
    from sqlqueue.consuming.registry import registered_consumers

    alias = using or get_settings().DATABASE
    stored = set(PartitionOffset.objects.using(alias)
                 .values_list("consumer_group", "topic").distinct())
    stored |= {(c.group, c.topic) for c in registered_consumers()}
    return sorted(stored)


def group_lag(group: str, topic: str, using: str | None = None) -> GroupLag:
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    with connection.cursor() as cursor:
        now = dialect_for(connection).database_now_ms(cursor)
    offsets = {o.partition_key: o for o in PartitionOffset.objects.using(alias)
               .filter(consumer_group=group, topic=topic)}
    leases = {lease.partition_key: lease for lease in PartitionLease.objects.using(alias)
              .filter(consumer_group=group, topic=topic)}
    lease_ms = round(conf.LEASE_DURATION * 1000)
    dead = QueueMessage.objects.using(alias).filter(
        topic=topic + conf.DLQ_SUFFIX, consumer_group=group)[:COUNT_CAP].count()
    result = GroupLag(group, topic, dead)
    messages = QueueMessage.objects.using(alias).filter(topic=topic)
    for key in sorted(set(offsets) | set(leases)):
        watermark = offsets[key].offset_acked if key in offsets else 0
        in_partition = messages.filter(partition_key=key)
        head = in_partition.order_by("-offset").values_list("offset", flat=True).first() or 0
        above = in_partition.filter(offset__gt=watermark)
        pending = above.order_by("offset")[:COUNT_CAP].count()
        oldest = above.order_by("offset").values_list("created_at", flat=True).first()
        states = DeliveryState.objects.using(alias).filter(
            consumer_group=group, topic=topic, partition_key=key, acked=False)
        lease = leases.get(key)
        live_lease = lease is not None and now - lease.lease_renewed_at < lease_ms
        partition = PartitionLag(
            partition_key=key,
            head_offset=head,
            watermark=watermark,
            pending=pending,
            in_flight=states.filter(invisible_until__gt=now)[:COUNT_CAP].count(),
            retrying=states.filter(retry_count__gt=0)[:COUNT_CAP].count(),
            oldest_pending_age=None if oldest is None else max(0.0, (now - oldest) / 1000),
            leased_by=lease.leased_by if live_lease and lease else "",
            lease_age=None if lease is None else (now - lease.lease_renewed_at) / 1000,
            watermark_age=(now - offsets[key].updated_at) / 1000 if key in offsets else None,
        )
        partition.status = _status(partition, dead)
        result.partitions.append(partition)
    return result


def _status(p: PartitionLag, dead_letters: int) -> str:
    if p.pending and not p.leased_by:
        return "STOP"
    if p.pending and p.watermark_age is not None and p.watermark_age > STALL_AFTER:
        return "STALL"
    if (p.oldest_pending_age or 0) > WARN_AFTER or p.retrying or dead_letters:
        return "WARN"
    return "OK"
