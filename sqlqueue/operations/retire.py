"""Retiring a consumer group (docs/guides/operations.md, "Retiring a group"): delete its
offsets, delivery state, leases, heartbeats, dead letters and pauses, so that garbage
collection no longer waits for it.

A group that left the code base still has its ``queue_offsets`` rows, which keep it
*known* to garbage collection (guarantee I8): it shows STOP for ever and holds every message of
its topics back. Retiring it is refused while a live subscriber of the group runs (it
would write its state back at once): stop those first, and remove the consumer from the
code, since a process that registers the group counts it too.

Big tables are deleted in batches of ``RETIRE_BATCH`` rows, each its own transaction (short
locks; an interrupted run is simply run again). The offsets go last: until then the group
still holds garbage collection back, so an interruption never lets it collect early.

A retired group that comes back (someone deploys its consumer again) starts like a new
group: from the oldest message still stored in each partition (watermark 0), so it misses
nothing published after the retirement; to start from the head instead, pause it before
the deploy and run ``queue reset-position G T KEY --to-head`` on its partitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connections, transaction
from django.db.models import Q

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import (
    DeadLetter,
    DeliveryState,
    FlowControl,
    PartitionLease,
    PartitionOffset,
    SubscriberHeartbeat,
)

RETIRE_BATCH = 1000


class CannotRetire(SqlqueueError, ValueError):
    """The group is unknown, or still has live subscribers."""


@dataclass
class Retired:
    group: str
    topics: list[str]
    deleted: dict[str, int] = field(default_factory=dict)  # table -> rows

    def describe(self) -> str:
        counts = ", ".join(f"{n} {table}" for table, n in self.deleted.items())
        return (f"Retired group {self.group} on {', '.join(self.topics)}: deleted {counts}. "
                "Garbage collection no longer waits for it.")


def retire_group(group: str, topic: str | None = None, *, using: str | None = None,
                 on_progress: Callable[[str, int], None] | None = None) -> Retired:
    """Retire ``group`` on ``topic`` (None: on every topic it has state on)."""
    conf = get_settings()
    alias = using or conf.DATABASE
    topics = group_topics(group, alias) if topic is None else [topic]
    if not group or not topics or not any(_has_trace(group, t, alias) for t in topics):
        where = f"on topic {topic!r}" if topic else "on any topic"
        raise CannotRetire(f"No consumer group {group!r} {where}: nothing to retire.")
    in_code = [t for t in topics if registered_here(group, t)]
    if in_code:
        raise CannotRetire(f"Group {group!r} is still registered in the code on "
                           f"{', '.join(in_code)}: every process that registers it counts it "
                           "for garbage collection again. Remove the consumer from the code "
                           "and deploy, then retire.")
    live = live_subscribers(group, topics, alias)
    if live:
        raise CannotRetire(f"Group {group!r} has live subscribers ({', '.join(live)}): stop "
                           "them (and remove the consumer from the code) first.")
    result = Retired(group, topics)

    def count(table: str, n: int) -> None:
        result.deleted[table] = result.deleted.get(table, 0) + n
        if on_progress is not None and n:
            on_progress(table, result.deleted[table])

    for name in topics:
        scope = {"consumer_group": group, "topic": name}
        with transaction.atomic(using=alias):
            count("heartbeats", SubscriberHeartbeat.objects.using(alias).filter(**scope)
                  .delete()[0])
            count("leases", PartitionLease.objects.using(alias).filter(**scope).delete()[0])
            count("pauses", FlowControl.objects.using(alias).filter(**scope).delete()[0])
        _delete_states(alias, group, name, count)
        _delete_dead_letters(alias, group, name + conf.DLQ_SUFFIX, name, count)
        with transaction.atomic(using=alias):
            count("offsets", PartitionOffset.objects.using(alias).filter(**scope).delete()[0])
    return result


def group_topics(group: str, alias: str) -> list[str]:
    """The topics ``group`` has any state on (offsets, leases or heartbeats)."""
    topics: set[str] = set()
    for model in (PartitionOffset, PartitionLease, SubscriberHeartbeat):
        topics |= set(model.objects.using(alias).filter(consumer_group=group)
                      .values_list("topic", flat=True).distinct())
    return sorted(topics)


def _has_trace(group: str, topic: str, alias: str) -> bool:
    scope = Q(consumer_group=group, topic=topic)
    return any(model.objects.using(alias).filter(scope).exists()
               for model in (PartitionOffset, PartitionLease, SubscriberHeartbeat,
                             DeliveryState))


def registered_here(group: str, topic: str) -> bool:
    """Is (group, topic) a consumer of this process's code (``@consumer``)?"""
    from sqlqueue.consuming.registry import registered_consumers

    return any(c.group == group and c.topic == topic for c in registered_consumers())


def may_retire(group: str, topic: str, alias: str, held: bool) -> bool:
    """What the docs allow retiring (docs/guides/operations.md, "Retiring a group"): a
    group nobody holds or runs, whose consumer is no longer in the code."""
    return (not held and not registered_here(group, topic)
            and not live_subscribers(group, [topic], alias))


def live_subscribers(group: str, topics: list[str], alias: str) -> list[str]:
    """Names of the group's subscribers with a fresh heartbeat (database time)."""
    connection = connections[alias]
    within = round(get_settings().LEASE_DURATION * 1000)
    with connection.cursor() as cursor:
        store = storage.store(connection)
        return sorted({name for topic in topics
                       for name in store.live_subscribers(cursor, group, topic, within)})


def _delete_states(alias: str, group: str, topic: str,
                   count: Callable[[str, int], None]) -> None:
    """The group's delivery state, a primary-key range of one partition per batch."""
    states = DeliveryState.objects.using(alias).filter(consumer_group=group, topic=topic)
    while True:
        first = states.order_by("partition_key", "message_offset").values_list(
            "partition_key", "message_offset").first()
        if first is None:
            return
        key = first[0]
        upto = list(states.filter(partition_key=key).order_by("message_offset")
                    .values_list("message_offset", flat=True)[:RETIRE_BATCH])[-1]
        with transaction.atomic(using=alias):
            count("delivery states", states.filter(partition_key=key,
                                                   message_offset__lte=upto).delete()[0])


def _delete_dead_letters(alias: str, group: str, dead_letter_topic: str, topic: str,
                         count: Callable[[str, int], None]) -> None:
    letters = DeadLetter.objects.using(alias).filter(topic=dead_letter_topic,
                                                     consumer_group=group,
                                                     original_topic=topic)
    while True:
        offsets = list(letters.order_by("offset").values_list("offset", flat=True)
                       [:RETIRE_BATCH])
        if not offsets:
            return
        with transaction.atomic(using=alias):
            count("dead letters", DeadLetter.objects.using(alias)
                  .filter(offset__in=offsets).delete()[0])
