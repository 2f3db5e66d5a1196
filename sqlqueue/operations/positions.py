"""Operator repairs of a group's position: retry backing-off messages now, and move a
partition's watermark (rewind to replay, or skip to the head).

A running subscriber keeps a partition's progress in memory (what it fetched, when each
retry is due), so a repair made behind its back would be ignored or undone. Each repair
therefore *revokes* the partition's lease in its own transaction: the lease row is
locked (waiting for the holder's current write to commit), its generation bumped and
its holder cleared. The holder's next write fails its fencing check (guarantee I5), it drops
the partition, and whoever acquires it next starts from what the database now says,
within about one renew interval. Handlers in flight on that partition finish, but their
outcomes are not recorded: those messages are delivered again (at least once).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import F, QuerySet

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import DeliveryState, PartitionLease, PartitionOffset


class InvalidPosition(SqlqueueError, ValueError):
    """A position reset that names no partition or an impossible offset."""


@dataclass(frozen=True)
class PositionReset:
    group: str
    topic: str
    partition_key: str
    previous_watermark: int
    watermark: int  # every offset <= this is now done for the group
    to_head: bool

    def describe(self) -> str:
        where = f"Reset {self.group} on {self.topic}/{self.partition_key}"
        if self.to_head:
            return (f"{where}: every message up to offset {self.watermark} is skipped "
                    f"(the watermark was {self.previous_watermark}).")
        return (f"{where}: every stored message from offset {self.watermark + 1} on is "
                f"delivered (again) (the watermark was {self.previous_watermark}).")


def retry_now(group: str, topic: str, partition_key: str | None = None, *,
              using: str | None = None) -> int:
    """Make every message of ``group`` that failed and waits for its next attempt
    deliverable at once (in one partition, or in all of the topic's). Returns how many."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        partitions = sorted(set(_waiting(alias, group, topic, partition_key)
                                .values_list("partition_key", flat=True)))
        for key in partitions:
            _revoke_lease(alias, group, topic, key)  # may wait for the holder's write
        # The time again, after the waits: a message delivered meanwhile (in flight, not
        # waiting) is not made visible under its handler.
        return _waiting(alias, group, topic, partition_key).filter(
            partition_key__in=partitions).update(invisible_until=0)


def _waiting(alias: str, group: str, topic: str,
             partition_key: str | None) -> QuerySet[DeliveryState]:
    """Failed messages waiting for their next attempt, as of the database's now."""
    waiting = DeliveryState.objects.using(alias).filter(
        consumer_group=group, topic=topic, acked=False, invisible_until__gt=_now_ms(alias),
    ).exclude(last_error="")
    if partition_key is not None:
        waiting = waiting.filter(partition_key=partition_key)
    return waiting


def reset_position(group: str, topic: str, partition_key: str, *,
                   deliver_from: int | None = None, to_head: bool = False,
                   using: str | None = None) -> PositionReset:
    """Move ``group``'s watermark on one partition: ``deliver_from=N`` delivers every
    stored message with offset >= N (again), ``to_head=True`` skips every message stored
    so far. Delivery state the move makes stale (attempt counts, acks) is dropped."""
    if (deliver_from is None) == (not to_head):
        raise InvalidPosition("Give exactly one of deliver_from=<offset> or to_head=True.")
    if deliver_from is not None and (isinstance(deliver_from, bool)
                                     or not isinstance(deliver_from, int) or deliver_from < 1):
        raise InvalidPosition(f"deliver_from is an offset >= 1; got {deliver_from!r}.")
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            heads = storage.store(connection).partition_heads(cursor, topic)
        if partition_key not in heads:
            raise InvalidPosition(f"Topic {topic!r} has no partition {partition_key!r} "
                                  "(no message of it is stored).")
        head = heads[partition_key]
        target = head if to_head else int(deliver_from or 1) - 1
        if target > head:
            raise InvalidPosition(
                f"Offset {deliver_from} is beyond partition {partition_key!r}'s newest "
                f"message ({head}); use to_head to skip everything."
            )
        _revoke_lease(alias, group, topic, partition_key)
        previous = _set_watermark(alias, group, topic, partition_key, target)
        states = DeliveryState.objects.using(alias).filter(
            consumer_group=group, topic=topic, partition_key=partition_key)
        if to_head:
            states.filter(message_offset__lte=target).delete()
        else:
            # Everything from the offset on is to do again, including messages acked
            # above the old watermark (which may trail them: unordered groups, and the
            # write horizon on MySQL); nothing below it has state any more.
            states.delete()
    return PositionReset(group, topic, partition_key, previous, target, to_head)


def _revoke_lease(alias: str, group: str, topic: str, partition_key: str) -> None:
    """Take the partition from its holder (module docstring). Lease rows are updated
    with a primary-key filter, so this waits for the holder's fenced write, if any."""
    PartitionLease.objects.using(alias).filter(
        consumer_group=group, topic=topic, partition_key=partition_key,
    ).update(generation=F("generation") + 1, leased_by="", lease_renewed_at=0)


def _set_watermark(alias: str, group: str, topic: str, partition_key: str,
                   watermark: int) -> int:
    """Set the watermark (creating the group's row if needed); returns the previous."""
    rows = PartitionOffset.objects.using(alias).filter(
        consumer_group=group, topic=topic, partition_key=partition_key)
    current = rows.select_for_update().values_list("offset_acked", flat=True).first()
    now = _now_ms(alias)  # after the lock wait
    if current is None:
        PartitionOffset.objects.using(alias).create(
            consumer_group=group, topic=topic, partition_key=partition_key,
            offset_acked=watermark, updated_at=now)
        return 0
    rows.update(offset_acked=watermark, updated_at=now, first_pending=None)  # unknown now
    return int(current)


def _now_ms(alias: str) -> int:
    connection = connections[alias]
    with connection.cursor() as cursor:
        return storage.store(connection).database_now_ms(cursor)


__all__ = ["InvalidPosition", "PositionReset", "reset_position", "retry_now"]
