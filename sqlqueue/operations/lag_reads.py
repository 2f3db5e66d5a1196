"""The reads behind lag (``sqlqueue.operations.lag.topic_lags``): each bounded, by index.

The topics are read once for all their groups (``TopicRead``: heads, positions, hints;
``lag_many``); then, per lagging partition, its pending messages, counted up to a cap or,
past the count budget, only the first one found (from the consumer's hint, or by a probe
the database answers while planning).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlqueue.models import DeliveryState
from sqlqueue.operations.lag_shapes import PartitionLag
from sqlqueue.storage.protocols import OperatorStore
from sqlqueue.storage.sql.operating import PendingSummary

LAST_ERRORS_READ = 1_000


@dataclass
class TopicRead:
    """What one read of a topic shares among its groups."""

    alias: str
    topic: str
    now: int
    heads: dict[str, int]
    positions: dict[str, dict[str, tuple[int, int]]]  # group -> key -> (watermark, moved)
    hints: dict[str, dict[str, int]]  # group -> key -> first pending, as its consumer saw it
    #: per lagging partition; None: too many lag to count (see lag._pair_cap)
    cap: int | None
    #: Without a cap: (partition, watermark) -> the first message stored above it, as
    #: (offset, due, addressed to), read once for every group (see first_messages_above).
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


@dataclass(frozen=True)
class StateCounts:
    """A group's delivery states on one partition, by kind."""

    in_flight: int = 0  # first attempt running (not yet failed)
    retrying: int = 0  # failed at least once, not yet acked
    acked: int = 0  # acked, the watermark not past them yet


@dataclass(frozen=True)
class Pending:
    """A group's pending messages on one partition, as far as they were counted."""

    count: int  # not acked by the group, up to the cap (1: known to be at least one)
    capped: bool
    oldest_due_at: int


def partition_lag(read: TopicRead, group: str, key: str, pending: Pending | None,
                  states: StateCounts | None, lease: tuple[str, int | None] | None, dead: int,
                  count_pending: bool, lease_duration: float) -> PartitionLag:
    """Where ``group`` stands on partition ``key``, from what was read (the status is the
    caller's to set)."""
    watermark, moved_at = read.position(group, key)
    owner, lease_age_ms = lease or ("", None)
    states = states or StateCounts()
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


def pending_probes(read: TopicRead, group: str) -> list[tuple[str, str, str, int]]:
    """The (topic, group, partition, watermark) probes of ``pending_summaries`` for the
    partitions where the group may have pending messages (those with a count cap)."""
    return [(read.topic, group, key, watermark)
            for key, watermark in sorted(read.lagging(group).items())]


def pending_found(read: TopicRead, summary: dict[str, PendingSummary],
                  states: dict[str, StateCounts]) -> dict[str, Pending]:
    """Partition -> its pending messages, from what ``pending_summaries`` found of the
    group's lagging partitions (counted up to ``read.cap``)."""
    assert read.cap is not None
    result = {}
    for key, found in summary.items():
        if found.oldest_due_at is None:
            continue  # only replays for other groups, or messages acked and settling
        stored = found.count or 0
        result[key] = Pending(max(1, stored - states.get(key, StateCounts()).acked),
                              stored >= read.cap, found.oldest_due_at)
    return result


def first_messages_above(cursor: Any, store: OperatorStore, read: TopicRead,
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
    dues = store.message_dues(cursor, sorted(set(firsts.values())))
    unknown = sorted(pair for pair in hinted if firsts.get(pair, -1) not in dues)
    probed = store.first_offsets_above(cursor, read.topic, unknown)
    dues.update(store.message_dues(
        cursor, sorted({first for first in probed if first is not None} - set(dues))))
    firsts.update((pair, first) for pair, first in zip(unknown, probed, strict=True)
                  if first is not None)
    return {pair: (first, *dues[first]) for pair, first in firsts.items()
            if first in dues}  # else: nothing stored above that watermark now


def first_pending_only(cursor: Any, store: OperatorStore, read: TopicRead, group: str,
                       lagging: dict[str, int], states: dict[str, StateCounts]
                       ) -> dict[str, Pending]:
    """Too many partitions lag to count them all: each one's first message above the
    watermark (``read.firsts``) is its first pending one. Where that first message is a
    replay for another group, or may be one the group acked that is still settling, the
    exact probe decides."""
    firsts = {key: read.firsts[key, watermark] for key, watermark in lagging.items()
              if (key, watermark) in read.firsts}  # else: nothing stored above it any more
    # Where the group has acked messages the watermark has not passed yet (settling),
    # the first message may be one of them: its delivery state says (by primary key).
    settling = store.acked_among(cursor, group, read.topic, sorted(
        (key, first[0]) for key, first in firsts.items()
        if states.get(key, StateCounts()).acked))
    result, unsure = {}, {}
    for key, (offset, due, addressed) in sorted(firsts.items()):
        if addressed not in ("", group) or (key, offset) in settling:
            unsure[key] = lagging[key]
        else:
            result[key] = Pending(1, True, due)
    for key, found in store.pending_summary(cursor, read.topic, group, unsure,
                                              None).items():
        if found.oldest_due_at is not None:
            result[key] = Pending(1, True, found.oldest_due_at)
    return result


def read_last_errors(alias: str, group: str, topic: str) -> dict[str, str]:
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
