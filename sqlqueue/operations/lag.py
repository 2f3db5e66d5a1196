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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Count, Q

from sqlqueue.conf import get_settings
from sqlqueue.models import DeliveryState, PartitionLease, PartitionOffset
from sqlqueue.operations.flow import PauseRow, is_paused, pauses
from sqlqueue.storage.sql import Dialect, dialect_for

COUNT_CAP = 10_000  # the most any one count reads
COUNT_BUDGET = 100_000  # index entries all the partitions of one group together may count
MIN_PARTITION_CAP = 100
WARN_AFTER = 60.0
STALL_AFTER = 300.0
LAST_ERRORS_READ = 1_000
SEVERITY = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3, "PAUSED": 1}


@dataclass
class PartitionLag:
    partition_key: str
    head_offset: int
    watermark: int
    lagging: bool  # a message for this group is stored above the watermark
    pending: int | None  # messages above the watermark the group has not acked, counted up
    # to the cap (None: not counted)
    in_flight: int  # first attempt running (not yet failed)
    retrying: int  # failed at least once, not yet acked: backing off or on a later attempt
    dead_letters: int  # of this group, from this partition, waiting for triage
    oldest_pending_age: float | None  # seconds the first pending message has been due
    leased_by: str  # the live holder, or "" (nobody holds it)
    lease_age: float | None  # seconds since the lease was last renewed
    watermark_age: float | None  # seconds since the watermark last moved
    pending_capped: bool = False  # ``pending`` is a lower bound
    status: str = "OK"
    last_error: str = ""  # of the first message still retrying here ("" if none)


@dataclass
class GroupLag:
    group: str
    topic: str
    dead_letters: int  # counted up to COUNT_CAP
    partitions: list[PartitionLag] = field(default_factory=list)
    paused: bool = False  # by an operator (queue pause)

    @property
    def status(self) -> str:
        status = worst(p.status for p in self.partitions)
        return "PAUSED" if self.paused and status != "STOP" else status

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


@dataclass
class _TopicRead:
    """What one read of a topic shares among its groups."""

    alias: str
    topic: str
    now: int
    heads: dict[str, int]
    positions: dict[str, dict[str, tuple[int, int]]]  # group -> key -> (watermark, moved)
    hints: dict[str, dict[str, int]]  # group -> key -> first pending, as its consumer saw it
    cap: int | None  # per lagging partition; None: too many lag to count (see _pair_cap)
    #: Without a cap: (partition, watermark) -> the first message stored above it, as
    #: (offset, due, addressed to), read once for every group (see _first_messages_above).
    firsts: dict[tuple[str, int], tuple[int, int, str]] = field(default_factory=dict)
    _lagging: dict[str, dict[str, int]] = field(default_factory=dict)

    def position(self, group: str, key: str) -> tuple[int, int]:
        return self.positions.get(group, {}).get(key, (0, 0))

    def lagging(self, group: str) -> dict[str, int]:
        """Partition -> watermark, where a message is stored above the watermark (worked
        out once per group: a scrape asks for every group's several times)."""
        found = self._lagging.get(group)
        if found is None:
            mine = self.positions.get(group, {})
            found = self._lagging[group] = {}
            for key, head in self.heads.items():
                watermark = mine[key][0] if key in mine else 0
                if head > watermark:
                    found[key] = watermark
        return found


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
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        now = dialect.database_now_ms(cursor)
        if heads is None:
            heads = dialect.partition_heads(cursor, topic)
    read = _read_topic(alias, topic, now, heads)
    leases = _leases(alias, topic, groups, now)
    states = _delivery_summary(alias, topic, groups, now)
    if read.cap is None:
        with connection.cursor() as cursor:
            read.firsts = _first_messages_above(cursor, dialect, read, groups)
    result = []
    for group in groups:
        with connection.cursor() as cursor:
            dead = dialect.dead_letter_counts(cursor, topic + conf.DLQ_SUFFIX, group, COUNT_CAP)
            pending = _pending(cursor, dialect, read, group, states.get(group, {}),
                               count_pending)
        mine = states.get(group, {})
        errors = (_last_errors(alias, group, topic)
                  if last_errors and any(s.retrying for s in mine.values()) else {})
        lag = GroupLag(group, topic, sum(dead.values()),
                       paused=is_paused(group, topic, alias, paused))
        keys = set(heads) | set(read.positions.get(group, {})) | set(dead)
        for key in sorted(keys | set(leases.get(group, {}))):
            partition = _partition(read, group, key, pending.get(key), mine.get(key),
                                   leases.get(group, {}).get(key), dead.get(key, 0),
                                   count_pending, conf.LEASE_DURATION)
            partition.last_error = errors.get(key, "")
            partition.status = partition_status(partition, lag.paused)
            lag.partitions.append(partition)
        result.append(lag)
    return result


@dataclass(frozen=True)
class _States:
    in_flight: int = 0  # first attempt running (not yet failed)
    retrying: int = 0  # failed at least once, not yet acked
    acked: int = 0  # acked, the watermark not past them yet


@dataclass(frozen=True)
class _Pending:
    count: int  # not acked by the group, up to the cap (1: known to be at least one)
    capped: bool
    oldest_due_at: int


def _partition(read: _TopicRead, group: str, key: str, pending: _Pending | None,
               states: _States | None, lease: tuple[str, int | None] | None, dead: int,
               count_pending: bool, lease_duration: float) -> PartitionLag:
    watermark, moved_at = read.position(group, key)
    owner, lease_age_ms = lease or ("", None)
    states = states or _States()
    live = lease_age_ms is not None and lease_age_ms < round(lease_duration * 1000)
    return PartitionLag(
        partition_key=key,
        head_offset=max(read.heads.get(key, 0), watermark),
        watermark=watermark,
        lagging=pending is not None,
        pending=(pending.count if pending else 0) if count_pending else None,
        pending_capped=bool(pending and pending.capped and count_pending),
        in_flight=states.in_flight,
        retrying=states.retrying,
        dead_letters=dead,
        oldest_pending_age=(None if pending is None
                            else max(0.0, (read.now - pending.oldest_due_at) / 1000)),
        leased_by=owner if live else "",
        lease_age=None if lease_age_ms is None else lease_age_ms / 1000,
        # A position written by another client (or an old repair) may carry no time: no
        # age then, rather than the 56 years since the epoch.
        watermark_age=(read.now - moved_at) / 1000 if moved_at > 0 else None,
    )


def _read_topic(alias: str, topic: str, now: int, heads: dict[str, int]) -> _TopicRead:
    """Every group's positions on the topic (one read by ``idx_topic_partition``), and
    the count cap, from the lagging partitions of every known group of the topic (so
    that every page and the metrics count the same)."""
    positions: dict[str, dict[str, tuple[int, int]]] = {}
    hints: dict[str, dict[str, int]] = {}
    for group, key, acked, moved, hint in (
            PartitionOffset.objects.using(alias).filter(topic=topic)
            .values_list("consumer_group", "partition_key", "offset_acked", "updated_at",
                         "first_pending")):
        positions.setdefault(group, {})[key] = (int(acked), int(moved))
        if hint is not None and hint > acked:
            hints.setdefault(group, {})[key] = int(hint)
    read = _TopicRead(alias, topic, now, heads, positions, hints, None)
    known = {g for g, t in known_subscriptions(alias) if t == topic}
    read.cap = _pair_cap(sum(len(read.lagging(group)) for group in known))
    return read


def _leases(alias: str, topic: str, groups: list[str], now: int
            ) -> dict[str, dict[str, tuple[str, int | None]]]:
    """group -> partition -> (holder, ms since its last renewal). A lease an operator's
    repair revoked has lease_renewed_at 0: no age (not 56 years)."""
    result: dict[str, dict[str, tuple[str, int | None]]] = {}
    for group, key, owner, renewed in (
            PartitionLease.objects.using(alias).filter(topic=topic, consumer_group__in=groups)
            .values_list("consumer_group", "partition_key", "leased_by", "lease_renewed_at")):
        result.setdefault(group, {})[key] = (owner, now - renewed if renewed else None)
    return result


def _pending(cursor: Any, dialect: Dialect, read: _TopicRead, group: str,
             states: dict[str, _States], count: bool) -> dict[str, _Pending]:
    """Partition -> its pending messages, for the partitions where the group has one."""
    lagging = read.lagging(group)
    if not lagging:
        return {}
    if read.cap is None:
        return _first_pending_only(cursor, dialect, read, group, lagging, states)
    summary = dialect.pending_summary(cursor, read.topic, group, lagging,
                                      read.cap if count else None)
    result = {}
    for key, found in summary.items():
        if found.oldest_due_at is None:
            continue  # only replays for other groups, or messages acked and settling
        stored = found.count or 0
        result[key] = _Pending(max(1, stored - states.get(key, _States()).acked),
                               stored >= read.cap, found.oldest_due_at)
    return result


def _first_messages_above(cursor: Any, dialect: Dialect, read: _TopicRead,
                          groups: list[str]) -> dict[tuple[str, int], tuple[int, int, str]]:
    """The first message stored above each lagging (partition, watermark) of ``groups``,
    and when it is due (by primary key). Where the group's runconsumer left a hint of it
    (``queue_offsets.first_pending``, written with the watermark), the hint is taken;
    elsewhere the cheapest probe finds it (a MIN the database answers while planning),
    once for the topic: groups at the same watermark of a partition share a probe.

    A hint is what the consumer had fetched: every row between the watermark and it was
    done. It misses a message committed late below it (at most ``MAX_TRANSACTION_AGE``
    older than the hint); a hint whose message is gone is not used."""
    hinted: dict[tuple[str, int], int] = {}  # -1: some group at that pair has no hint
    for group in groups:
        hints = read.hints.get(group, {})
        for key, watermark in read.lagging(group).items():
            hint = hints.get(key, -1)
            # Groups at one (partition, watermark) share its answer when they agree.
            hinted[key, watermark] = hint if hinted.get((key, watermark), hint) == hint else -1
    firsts = {pair: hint for pair, hint in hinted.items() if hint > 0}
    dues = dialect.message_dues(cursor, sorted(set(firsts.values())))
    unknown = sorted(pair for pair in hinted if firsts.get(pair, -1) not in dues)
    probed = dialect.first_offsets_above(cursor, read.topic, unknown)
    dues.update(dialect.message_dues(
        cursor, sorted({first for first in probed if first is not None} - set(dues))))
    firsts.update((pair, first) for pair, first in zip(unknown, probed, strict=True)
                  if first is not None)
    return {pair: (first, *dues[first]) for pair, first in firsts.items()
            if first in dues}  # else: nothing stored above that watermark now


def _first_pending_only(cursor: Any, dialect: Dialect, read: _TopicRead, group: str,
                        lagging: dict[str, int], states: dict[str, _States]
                        ) -> dict[str, _Pending]:
    """Too many partitions lag to count them all: each one's first message above the
    watermark (``read.firsts``) is its first pending one. Where that first message is a
    replay for another group, or may be one the group acked that is still settling, the
    exact probe decides."""
    firsts = {key: read.firsts[key, watermark] for key, watermark in lagging.items()
              if (key, watermark) in read.firsts}  # else: nothing stored above it any more
    # Where the group has acked messages the watermark has not passed yet (settling),
    # the first message may be one of them: its delivery state says (by primary key).
    settling = dialect.acked_among(cursor, group, read.topic, sorted(
        (key, first[0]) for key, first in firsts.items() if states.get(key, _States()).acked))
    result, unsure = {}, {}
    for key, (offset, due, addressed) in sorted(firsts.items()):
        if addressed not in ("", group) or (key, offset) in settling:
            unsure[key] = lagging[key]
        else:
            result[key] = _Pending(1, True, due)
    for key, found in dialect.pending_summary(cursor, read.topic, group, unsure,
                                              None).items():
        if found.oldest_due_at is not None:
            result[key] = _Pending(1, True, found.oldest_due_at)
    return result


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


def _delivery_summary(alias: str, topic: str, groups: list[str], now: int
                      ) -> dict[str, dict[str, _States]]:
    """group -> partition -> its delivery states. Delivery state only exists above the
    watermark, so this reads the groups' working windows (primary-key prefix)."""
    rows = (DeliveryState.objects.using(alias)
            .filter(consumer_group__in=groups, topic=topic)
            .values("consumer_group", "partition_key")
            .annotate(in_flight=Count("message_offset", filter=Q(
                          acked=False, invisible_until__gt=now, last_error="")),
                      retrying=Count("message_offset", filter=Q(acked=False)
                                     & ~Q(last_error="")),
                      acked=Count("message_offset", filter=Q(acked=True)))
            .order_by())
    result: dict[str, dict[str, _States]] = {}
    for r in rows:
        result.setdefault(r["consumer_group"], {})[r["partition_key"]] = _States(
            r["in_flight"], r["retrying"], r["acked"])
    return result


def _last_errors(alias: str, group: str, topic: str) -> dict[str, str]:
    """Per partition: the last error of its first message still retrying. Reads at most
    ``LAST_ERRORS_READ`` delivery states (of the group's working window, by key prefix)."""
    rows = (DeliveryState.objects.using(alias)
            .filter(consumer_group=group, topic=topic, acked=False).exclude(last_error="")
            .order_by("partition_key", "message_offset")
            .values_list("partition_key", "last_error")[:LAST_ERRORS_READ])
    errors: dict[str, str] = {}
    for key, error in rows:
        errors.setdefault(key, error)
    return errors


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
