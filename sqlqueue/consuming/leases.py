"""Partition leases, heartbeats and fair sharing among the subscribers of a (group, topic).

Every ``LEASE_RENEW_INTERVAL`` a subscriber heartbeats, renews the leases it holds, reads
who is alive and who holds what, and then gives up or takes partitions so that with S
live subscribers and P partitions each holds floor(P/S) or ceil(P/S) (guarantee I12): the
subscribers sorted by name, the first P mod S get one more. All times are the database's
(guarantee I11); locally, a lease is trusted only until a deadline computed from the database's
own view of it, minus a safety margin, on the monotonic clock, so a paused or cut-off
subscriber stops starting handlers before anyone else can take its partitions (guarantee I5).
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper

from sqlqueue import events
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.limits import Limits
from sqlqueue.storage.protocols import LeaseStore

logger = logging.getLogger("sqlqueue.leases")
# What a subscriber stops working on is the consumer's news (its log since 0.1).
consumer_logger = logging.getLogger("sqlqueue.consumer")

PURGE_AFTER_LEASES = 10  # forget leases/heartbeats not renewed for 10 lease durations
QUICK_TICK = 0.1  # seconds between ticks while a rebalance is under way
#: at most one early tick this often for partitions a fence saw nobody holding
FREE_LEASE_RECHECK = 1.0
#: while busy, look this often between ticks whether a subscriber joined or left (two
#: plain reads): a newcomer gets its share from a busy holder within about a tenth of a
#: second; at 1 s, the first second of a 2.5 s drain by two processes was one's alone
MEMBERSHIP_RECHECK = QUICK_TICK
#: idle, at most this often, and only once the log grew: a member that stopped left its
#: partitions free, and a message published to one waited for the next renewal (10 s)
IDLE_MEMBERSHIP_RECHECK = 1.0
#: the same for an --until-empty runner: whoever finishes first leaves its partitions to
#: the others, whose exit waits for them to be taken and read to the end
WATCH_RECHECK = QUICK_TICK
# While waiting for partitions to be handed over, quick ticks go on for about two renew
# intervals without progress: the time a holder may take to notice a new member, finish
# its in-flight work on the partitions it gives up, and let go.


#: numbers of tenures, unique in the process
_tenures = itertools.count(1)


@dataclass
class Lease:
    generation: int
    deadline: float  # monotonic time after which this subscriber no longer trusts it
    #: this subscriber's holding of the lease, without a break: a new number whenever it
    #: is acquired, or found again after it was lost. Not the generation: a release
    #: deletes the row, and the next acquisition starts again at generation 1, so a lease
    #: lost and found again may carry the generation it had (what this subscriber
    #: delivered before must then not be recorded as the owner's).
    tenure: int


@dataclass(frozen=True)
class LeaseChange:
    """What a lease tick changed: the partitions gained, and those lost or released."""

    gained: frozenset[str] = frozenset()
    lost: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.gained or self.lost)


def fair_share(partitions: int, members: list[str], me: str) -> int:
    """How many partitions ``me`` should hold: floor(P/S), plus one for the first P mod S
    members by name, so that the shares add up to P exactly."""
    if not members or me not in members:
        # Not yet (or no longer) seen alive: claim a conservative share.
        count = len(members) + 1
        return max(1, -(-partitions // count))
    count = len(members)
    rank = sorted(members).index(me)
    return partitions // count + (1 if rank < partitions % count else 0)


def _note(keeper: LeaseKeeper, change: str, partition: str, lease: Lease | None,
          age_ms: int | None = None) -> None:
    """One lease event (``events.LEASE``, DEBUG): what the history checker's workloads
    record (tests/history), and an operator may follow."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s %s the lease on %s/%s (group %s)", keeper.name, change,
                     keeper.topic, partition, keeper.group, extra=events.fields(
                         events.LEASE, group=keeper.group, topic=keeper.topic,
                         partition=partition, subscriber=keeper.name, change=change,
                         generation=None if lease is None else lease.generation,
                         tenure=None if lease is None else lease.tenure, age_ms=age_ms))


class LeaseKeeper:
    """The leases one subscriber holds on one (group, topic)."""

    def __init__(self, group: str, topic: str, name: str, duration: float,
                 renew_interval: float, *, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.group = group
        self.topic = topic
        self.name = name
        self.duration_ms = round(duration * 1000)
        self.renew_interval = renew_interval
        # Stop trusting a lease this long before the database could let it go.
        self.margin = min(renew_interval, duration / 3)
        self.owned: dict[str, Lease] = {}
        self.releasing: set[str] = set()
        self.members: list[str] = []
        self.share = 0
        self.others: set[str] = set()  # partitions live subscribers other than me hold
        self._next_tick = 0.0
        self._ticks = 0
        self._quick_budget = int(2 * renew_interval / QUICK_TICK) + 2
        self._quick_left = self._quick_budget
        self._free_noticed_at = -FREE_LEASE_RECHECK
        self._members_checked_at = 0.0
        # The log's head when an idle subscriber last considered a look at the membership.
        self._membership_head = 0

    # -- local view ---------------------------------------------------------------------
    def holds(self, partition: str) -> bool:
        """May this subscriber start work on ``partition`` now?"""
        lease = self.owned.get(partition)
        return (lease is not None and partition not in self.releasing
                and self.host_clock.monotonic() < lease.deadline)

    def trusts(self, partition: str, tenure: int | None) -> bool:
        """Is the lease of ``partition`` still this subscriber's in ``tenure``, before
        its local deadline (whether or not it is being handed over)?"""
        lease = self.owned.get(partition)
        return (lease is not None and lease.tenure == tenure
                and self.host_clock.monotonic() < lease.deadline)

    def generation(self, partition: str) -> int | None:
        lease = self.owned.get(partition)
        return None if lease is None else lease.generation

    def tenure(self, partition: str) -> int | None:
        lease = self.owned.get(partition)
        return None if lease is None else lease.tenure

    def due(self) -> bool:
        return self.host_clock.monotonic() >= self._next_tick

    def hurry(self) -> None:
        """Tick at the next opportunity (new partitions, a member left)."""
        self._next_tick = 0.0

    def notice_free(self) -> None:
        """A fence saw partitions nobody holds (a member left, or its leases expired):
        tick soon instead of at the end of the renew interval, so that a rolling deploy
        does not leave them unserved for up to LEASE_RENEW_INTERVAL. At most once per
        FREE_LEASE_RECHECK, so that a partition left free a while costs little."""
        now = self.host_clock.monotonic()
        if now - self._free_noticed_at >= FREE_LEASE_RECHECK:
            self._free_noticed_at = now
            self.hurry()

    def awaiting_share(self) -> bool:
        """Short of the fair share at the last tick, and still ticking quickly for the
        partitions a holder is to hand over (for about two renew intervals at most)."""
        return len(self.owned) < self.share and self._quick_left > 0

    def membership_check_due(self, every: float = MEMBERSHIP_RECHECK) -> bool:
        return self.host_clock.monotonic() - self._members_checked_at >= every

    def membership_worth_a_look(self, *, busy: bool, watching: bool,
                                head: Callable[[], int] | None) -> bool:
        """Between ticks, is it time for ``check_membership``? Busy (or ``watching``, an
        --until-empty runner), every MEMBERSHIP_RECHECK (WATCH_RECHECK); idle, at most
        every IDLE_MEMBERSHIP_RECHECK and only once messages were published since
        (``head``: the log's head, read when needed), so that a member that left is
        replaced when its partitions have something to deliver, not at the next
        renewal, while a worker's idle polls stay at one statement."""
        if busy or watching:
            return self.membership_check_due(WATCH_RECHECK if watching else MEMBERSHIP_RECHECK)
        if head is None or not self.membership_check_due(IDLE_MEMBERSHIP_RECHECK):
            return False
        seen, self._membership_head = self._membership_head, head()
        return self._membership_head > seen

    def check_membership(self, cursor: CursorWrapper, store: LeaseStore,
                         discovered: Iterable[str]) -> None:
        """Between ticks: has a subscriber joined or left, or does nobody hold some
        partition (released by a member that stopped, or expired)? Then tick now, so that
        a newcomer gets its share from a busy holder, and a free partition a new holder,
        within about a tenth of a second instead of at the next renewal (up to
        LEASE_RENEW_INTERVAL). Plain reads: they wait for no lock."""
        self._members_checked_at = self.host_clock.monotonic()
        if store.live_subscribers(cursor, self.group, self.topic,
                                    self.duration_ms) != self.members:
            self.hurry()
            return
        ages = {partition: age for partition, _, _, age in
                store.list_leases(cursor, self.group, self.topic)}
        if any(key not in ages for key in discovered) or any(
                age >= self.duration_ms for age in ages.values()):
            self.notice_free()

    # -- the periodic tick ----------------------------------------------------------------
    def tick(self, cursor: CursorWrapper, store: LeaseStore, discovered: Iterable[str],
             idle: set[str], *, limits: Limits | None = None, in_flight: int = 0,
             ) -> LeaseChange:
        """Heartbeat, renew, rebalance. ``idle``: owned partitions with nothing in flight,
        which may be released now, once this process is within its max_in_flight share
        of ``limits`` among the members read (``in_flight``: its deliveries in flight).
        Returns the partitions gained, and those lost or released."""
        started = self.host_clock.monotonic()
        self._next_tick = started + self.renew_interval
        self._ticks += 1
        store.heartbeat(cursor, self.group, self.topic, self.name)
        # Only the rows of leases held (primary-key lookups), so that no peer's locks on
        # its own rows hold this renewal up. If it waits for a lock anyway (a peer paused
        # while fencing a partition it believes it holds), what the list below reads is
        # still the truth, and the leases not renewed run out safely.
        self._unless_locked(store, "renewing leases", lambda: store.renew_leases(
            cursor, self.group, self.topic, self.name,
            {partition: lease.generation for partition, lease in self.owned.items()}))
        leases = store.list_leases(cursor, self.group, self.topic)
        self.members = store.live_subscribers(cursor, self.group, self.topic, self.duration_ms)
        self._members_checked_at = self.host_clock.monotonic()
        before = set(self.owned)
        self._adopt(leases, started)
        partitions = set(discovered) | {partition for partition, *_ in leases}
        self.share = fair_share(len(partitions), self.members, self.name)

        share = None if limits is None else limits.in_flight_share(self.members, self.name)
        may_release = share is None or in_flight <= share
        released = self._shed(cursor, store, idle if may_release else set())
        wanted = self.share - len(self.owned)
        if wanted > 0:
            free = sorted(p for p in partitions if p not in self.owned and p not in self.others)
            if free:
                # Start at a place of our own in the list, so that subscribers
                # acquiring at once mostly ask for different partitions.
                start = zlib.crc32(self.name.encode()) % len(free)
                # Locked in key order, as every subscriber does: no deadlock between two
                # acquiring at once (the lock waits are bounded, a deadlock costs a tick).
                candidates = sorted((free[start:] + free[:start])[:wanted])
                # An expired lease is still locked while its paused holder's transaction
                # stays open (fencing, guarantee I5): the lock wait is bounded; try again later.
                self._unless_locked(store, "acquiring leases", lambda: store.acquire_leases(
                    cursor, self.group, self.topic, candidates, self.name, self.duration_ms))
                self._adopt(store.list_leases(cursor, self.group, self.topic), started)
        gained = set(self.owned) - before
        short = len(self.owned) < self.share
        # Progress, or nothing missing, renews the budget of quick ticks.
        self._quick_left = self._quick_left - 1 if short and not gained else self._quick_budget
        if self.releasing or (short and self._quick_left > 0):
            # Handing partitions over, or waiting a little for some to be handed over:
            # look again shortly, not in a whole renew interval, so that rebalancing
            # stays quick (a few times only, so that a slow peer does not make us spin).
            self._next_tick = min(self._next_tick, self.host_clock.monotonic() + QUICK_TICK)
        if self._ticks % PURGE_AFTER_LEASES == 0:
            self._unless_locked(store, "purging abandoned leases",
                                lambda: store.purge_abandoned(
                                    cursor, self.group, self.topic,
                                    PURGE_AFTER_LEASES * self.duration_ms))
        lost = (before - set(self.owned)) - released
        if gained or lost or released:
            logger.info("%s on %s/%s: holds %s of %s partitions (share %s, %s live); "
                        "+%s -%s released %s", self.name, self.group, self.topic,
                        len(self.owned), len(partitions), self.share, len(self.members),
                        len(gained), len(lost), len(released),
                        extra=events.fields(events.LEASES_CHANGED, group=self.group,
                                            topic=self.topic, subscriber=self.name,
                                            held=len(self.owned), gained=len(gained),
                                            lost=len(lost), released=len(released)))
        return LeaseChange(frozenset(gained), frozenset(lost | released))

    def _unless_locked(self, store: LeaseStore, what: str, statement: Callable[[], object]) -> bool:
        """Run ``statement``; if it gave up waiting for a lock (the wait is bounded, see
        ``Store.bound_lock_waits``), log it and go on: the next tick tries again."""
        try:
            statement()
        except DatabaseError as exc:
            if not store.is_lock_wait(exc):
                raise
            logger.warning("%s on %s/%s: gave up %s after a lock wait (%s); trying again at "
                           "the next lease tick.", self.name, self.group, self.topic, what, exc)
            self._next_tick = min(self._next_tick, self.host_clock.monotonic() + FREE_LEASE_RECHECK)
            return False
        return True

    def _adopt(self, leases: list[tuple[str, str, int, int]], started: float) -> None:
        """Believe the database: which leases are mine, with what generation, until when."""
        owned: dict[str, Lease] = {}
        others: set[str] = set()
        for partition, owner, generation, age_ms in leases:
            if age_ms >= self.duration_ms:
                continue  # expired: free for anyone, me included
            if owner == self.name:
                # Valid in the database until renewal + duration; that renewal happened
                # at most age_ms before the query, and the query after ``started``.
                remaining = (self.duration_ms - age_ms) / 1000
                held = self.owned.get(partition)
                tenure = (held.tenure if held is not None and held.generation == generation
                          else next(_tenures))
                owned[partition] = Lease(generation, started + remaining - self.margin,
                                         tenure)
                _note(self, "renewed" if held is not None and held.tenure == tenure
                      else "acquired", partition, owned[partition], age_ms)
            else:
                others.add(partition)
        for partition in set(self.owned) - set(owned):
            _note(self, "lost", partition, self.owned[partition])
        self.owned = owned
        self.others = others
        self.releasing &= set(owned)

    def _shed(self, cursor: CursorWrapper, store: LeaseStore, idle: set[str]) -> set[str]:
        """Give up partitions beyond the fair share: the highest keys first (the same
        choice every time), each once nothing of it is in flight."""
        excess = len(self.owned) - self.share
        if excess <= 0:
            self.releasing.clear()
            return set()
        self.releasing = set(sorted(self.owned)[-excess:])
        ready = sorted(self.releasing & idle)
        if ready:
            store.release_leases(cursor, self.group, self.topic, ready, self.name)
            for partition in ready:
                _note(self, "released", partition, self.owned.pop(partition))
            self.releasing -= set(ready)
            self.hurry()  # check again soon for the rest
        return set(ready)

    def lose(self, partition: str, owner: str, generation: int, age_ms: int) -> None:
        """The lease of ``partition`` is no longer this subscriber's: its fence saw the
        row held by ``owner`` at ``generation``, renewed ``age_ms`` ago. Says who holds
        it now; a row still under this subscriber's own name was not taken by it (it
        expired, or is of another generation: taken and given back, or written by
        another server before a failover)."""
        lease = self.owned.pop(partition, None)
        if lease is not None:
            _note(self, "lost", partition, lease)
        held = "none" if lease is None else lease.generation
        if owner != self.name:
            whom = f"to {owner!r}" if owner else "(nobody holds it)"
        elif age_ms >= self.duration_ms:
            whom = "(it expired before this subscriber renewed it)"
        else:
            whom = (f"(the database has generation {generation} under this subscriber's "
                    f"name, this subscriber holds {held}: "
                    "taken over and given back meanwhile, or another server's row)")
        consumer_logger.warning("%s lost the lease on %s/%s %s; stopping work on it.",
                                self.name, self.topic, partition, whom)

    def forget(self) -> None:
        """Hold nothing (the leases were on another server); acquire again at once."""
        for partition, lease in self.owned.items():
            _note(self, "lost", partition, lease)
        self.owned.clear()
        self.releasing.clear()
        self.others.clear()
        self.members = []
        self.hurry()

    def release_all(self, cursor: CursorWrapper, store: LeaseStore) -> None:
        """Graceful stop: hand every partition over and say goodbye."""
        store.release_leases(cursor, self.group, self.topic, sorted(self.owned), self.name)
        store.deregister(cursor, self.group, self.topic, self.name)
        for partition, lease in self.owned.items():
            _note(self, "released", partition, lease)
        self.owned.clear()
        self.releasing.clear()
