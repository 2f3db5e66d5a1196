"""Who consumes what: live subscribers of each (group, topic), the partitions each holds,
whether the split is fair, and leases nobody renews any more.

A subscriber is live while its heartbeat is younger than ``LEASE_DURATION`` and it has
not said goodbye; the fair share of each is floor(P/S) or ceil(P/S) partitions
(guarantee I12). A stale lease is one whose holder stopped renewing it: it is free for
the taking, and some live subscriber should take it within one renew interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import PartitionLease, SubscriberHeartbeat
from sqlqueue.operations.lag import known_subscriptions
from sqlqueue.operations.lag_many import of_topics, read_heads


@dataclass
class SubscriberInfo:
    name: str
    heartbeat_age: float | None  # seconds; None: never stamped
    live: bool
    partitions: list[str] = field(default_factory=list)  # held with a live lease


@dataclass
class StaleLease:
    partition_key: str
    holder: str  # "" once an operator's repair revoked it
    age: float | None  # seconds since its last renewal; None once revoked (stamped 0)


@dataclass
class Membership:
    group: str
    topic: str
    partitions: int  # stored partitions of the topic, and any with a lease row
    subscribers: list[SubscriberInfo] = field(default_factory=list)
    stale_leases: list[StaleLease] = field(default_factory=list)
    unheld: int = 0  # partitions with no live lease

    @property
    def live(self) -> list[SubscriberInfo]:
        return [s for s in self.subscribers if s.live]

    @property
    def fair_range(self) -> tuple[int, int]:
        """The fewest and most partitions a live subscriber should hold."""
        count = len(self.live)
        if not count:
            return (0, 0)
        return (self.partitions // count, -(-self.partitions // count))

    def is_fair(self, subscriber: SubscriberInfo) -> bool:
        low, high = self.fair_range
        return low <= len(subscriber.partitions) <= high

    @property
    def fair(self) -> bool:
        return all(self.is_fair(s) for s in self.live)


def memberships(using: str | None = None) -> list[Membership]:
    """One ``Membership`` per known (group, topic), in a number of statements that does not
    grow with the number of subscriptions (a topic's heads, leases and heartbeats read
    apart took 1.1-1.2 s for 1,500 subscribed topics)."""
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    store = storage.store(connection)
    lease_ms = round(conf.LEASE_DURATION * 1000)
    subscriptions = known_subscriptions(alias)
    topics = sorted({topic for _, topic in subscriptions})
    with connection.cursor() as cursor:
        now = store.database_now_ms(cursor)
        heads = read_heads(cursor, store, topics)[0] if topics else {}
    leases: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    for group, topic, key, holder, renewed in of_topics(
            PartitionLease.objects.using(alias), topics).values_list(
            "consumer_group", "topic", "partition_key", "leased_by", "lease_renewed_at"):
        leases.setdefault((group, topic), []).append((key, holder, renewed))
    beats: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for group, topic, name, beat, goodbye in of_topics(
            SubscriberHeartbeat.objects.using(alias), topics).values_list(
            "consumer_group", "topic", "subscriber_name", "heartbeat_at", "deregistered_at"):
        beats.setdefault((group, topic), []).append((name, beat, goodbye))
    return [_membership(group, topic, set(heads.get(topic, {})),
                        leases.get((group, topic), []), beats.get((group, topic), []),
                        now, lease_ms)
            for group, topic in subscriptions]


def _membership(group: str, topic: str, partitions: set[str],
                leases: list[tuple[str, str, int]], beats: list[tuple[str, int, int]],
                now: int, lease_ms: int) -> Membership:
    subscribers = {
        # A heartbeat stamped 0 (written by another client) has no age to show.
        name: SubscriberInfo(name, (now - beat) / 1000 if beat > 0 else None,
                             live=now - beat < lease_ms and not goodbye)
        for name, beat, goodbye in beats
    }
    membership = Membership(group, topic, len(partitions | {p for p, _, _ in leases}))
    held = set()
    for partition, holder, renewed in sorted(leases):
        if now - renewed < lease_ms:
            held.add(partition)
            subscribers.setdefault(holder, SubscriberInfo(holder, (now - renewed) / 1000,
                                                          live=True))
            subscribers[holder].partitions.append(partition)
        else:
            membership.stale_leases.append(StaleLease(
                partition, holder, (now - renewed) / 1000 if renewed else None))
    membership.subscribers = sorted(subscribers.values(), key=lambda s: s.name)
    membership.unheld = membership.partitions - len(held)
    return membership
