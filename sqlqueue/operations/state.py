"""The state of every subscription in one bounded read: the lag service's numbers (pending
counted up to its caps, oldest pending age, in flight, retrying, dead letters, status) plus
the live subscribers and the partitions held. The metrics view and ``queue health`` read it.

The same read as the lag overview (``operations.lag.subscription_lags``): every topic's
heads, positions, leases and delivery states once for all (a few statements, whatever the
number of topics), the lagging partitions' probes many to a statement, pending counted up
to each topic's count budget; the live subscribers of every subscription come from one
grouped read of the heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections
from django.db.models import Count

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import SubscriberHeartbeat
from sqlqueue.operations.lag import known_subscriptions, subscription_lags
from sqlqueue.operations.lag_shapes import GroupLag


@dataclass
class SubscriptionState:
    lag: GroupLag
    live_subscribers: int
    database: str = "default"  # the alias its tables are in

    @property
    def group(self) -> str:
        return self.lag.group

    @property
    def topic(self) -> str:
        return self.lag.topic

    @property
    def partitions(self) -> int:
        return len(self.lag.partitions)

    @property
    def held(self) -> int:
        return self.lag.held


def subscription_states(using: str | None = None, group: str | None = None,
                        topic: str | None = None) -> list[SubscriptionState]:
    """Every known (group, topic), optionally only ``group`` and/or ``topic``: in the
    database ``using``, or (None) in every database the queue lives in
    (``SQLQUEUE["DATABASE"]`` and the aliases of ``ROUTES``)."""
    if using is None:
        return [state for alias in get_settings().databases
                for state in subscription_states(alias, group, topic)]
    alias = using
    selected = [(g, t) for g, t in known_subscriptions(alias)
                if (group is None or g == group) and (topic is None or t == topic)]
    if not selected:
        return []
    live = live_subscriber_counts(alias)
    return [SubscriptionState(lag, live.get((lag.group, lag.topic), 0), alias)
            for lag in subscription_lags(selected, using=alias)]


def live_subscriber_counts(using: str | None = None) -> dict[tuple[str, str], int]:
    """(group, topic) -> subscribers whose heartbeat is younger than ``LEASE_DURATION`` and
    who have not said goodbye (the rule of ``operations.subscribers``)."""
    conf = get_settings()
    alias = using or conf.DATABASE
    connection = connections[alias]
    with connection.cursor() as cursor:
        now = storage.store(connection).database_now_ms(cursor)
    rows = (SubscriberHeartbeat.objects.using(alias)
            .filter(heartbeat_at__gt=now - round(conf.LEASE_DURATION * 1000),
                    deregistered_at=0)
            .values("consumer_group", "topic").annotate(live=Count("subscriber_name"))
            .order_by())
    return {(r["consumer_group"], r["topic"]): r["live"] for r in rows}
