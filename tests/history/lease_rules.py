"""The history checker's lease rules (docs/reference/guarantees.md), on the lease events a
history recorded (``History.leases``: acquired, renewed, lost, released):

* **I11** one clock: by the database's clock, a partition's lease changes hands only
  once the previous holder's lease ran out (its last renewal + ``LEASE_DURATION``) or
  was released: no two tenures of one partition overlap, whatever the workers' clocks
  say. A failover or a database restart excuses it (the new server voids the old one's
  grants, ``consuming/takeover.py``).
* **I12** (its availability half) no partition with work waiting is left unowned
  longer than about a lease after its holder's lease ran out or was released: another
  subscriber, or the holder itself, takes it within ``LEASE_DURATION`` more, unless
  nobody could (no subscriber of the group held anything meanwhile) or a fault of the
  others or of the database (a kill, a pause, an outage, a lock stall) came in between;
  each such fault moves the deadline to a lease and a renew interval after its end. Work
  waiting: a message of the partition committed before the deadline that the group first
  ran after the lease ended (a partition with nothing to deliver may rightly stay free:
  the fair share counts the partitions discovered, and one whose messages are all
  collected is not). A partition never taken again with work waiting is I3's. The
  fair-share counts
  themselves are ``tests/acceptance/test_distribution.py``'s.

Times of acquisitions and renewals are the database's (a row's age when the subscriber
read it, on this machine's clock, which the database server shares); ``LEASE_SLACK_MS``
covers the time between that read and the log record.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.history.model import History, LeaseEvent

#: how far a recorded acquisition or renewal time may be after the database's own
LEASE_SLACK_MS = 250.0


@dataclass
class Tenure:
    """One subscriber's unbroken holding of one partition's lease."""

    group: str
    partition: str
    holder: str
    runner: str
    start_ms: float
    renewed_ms: float  # its latest acquisition or renewal, by the database clock
    released_ms: float | None = None
    lost_ms: float | None = None
    events: list[LeaseEvent] = field(default_factory=list)

    def valid_until(self, lease_ms: float, renewed_ms: float | None = None) -> float:
        """Until when the database let nobody else take it (``renewed_ms``: its latest
        renewal, if known better than recorded)."""
        renewed = self.renewed_ms if renewed_ms is None else renewed_ms
        if self.released_ms is not None:
            return min(self.released_ms, renewed + lease_ms)
        return renewed + lease_ms


def tenures(history: History) -> dict[tuple[str, str], list[Tenure]]:
    """Every tenure of every (group, partition), by start."""
    events: dict[tuple[str, str, str, int | None], list[LeaseEvent]] = defaultdict(list)
    for event in history.leases:
        events[(event.group, event.partition, event.holder, event.tenure)].append(event)
    found: dict[tuple[str, str], list[Tenure]] = defaultdict(list)
    for (group, partition, holder, _), held in events.items():
        held.sort(key=lambda e: e.at_ms)
        alive = [e.at_ms for e in held if e.change in ("acquired", "renewed")]
        if not alive:
            continue  # only its end was recorded
        tenure = Tenure(group, partition, holder, held[0].runner, min(alive), max(alive),
                        events=held)
        for event in held:
            if event.change == "released":
                tenure.released_ms = event.at_ms
            elif event.change == "lost":
                tenure.lost_ms = event.at_ms
        found[(group, partition)].append(tenure)
    for held_list in found.values():
        held_list.sort(key=lambda t: t.start_ms)
    return found


class LeaseRules:
    def __init__(self, history: History) -> None:
        self.history = history
        self.lease_ms = float(history.lease_ms or 0)
        self.tenures = tenures(history) if history.lease_ms else {}
        self._first_runs: dict[tuple[str, str], list[tuple[float, float]]] | None = None

    def one_clock(self) -> Iterator[tuple[str, list[LeaseEvent]]]:
        """I11: (text, events) of each tenure that began while an earlier one of its
        partition was still valid by the database clock."""
        for (group, partition), held in self.tenures.items():
            for index, later in enumerate(held):
                for earlier in held[:index]:
                    until = earlier.valid_until(self.lease_ms, self._renewed_at_least(earlier))
                    if later.start_ms + LEASE_SLACK_MS >= until:
                        continue
                    if self._server_changed(earlier.renewed_ms, later.start_ms):
                        continue
                    yield (f"{group}/{partition}: {later.holder} acquired the lease at "
                           f"{later.start_ms:.0f} (database clock) while {earlier.holder}'s "
                           f"was valid until {until:.0f}",
                           [*earlier.events[-2:], *later.events[:1]])

    def never_left_unowned(self) -> Iterator[tuple[str, list[LeaseEvent]]]:
        """I12: (text, events) of each partition left without a holder for longer than a
        lease after its holder's lease ended, while a subscriber could have taken it."""
        by_group: dict[str, list[Tenure]] = defaultdict(list)
        for (group, _), held in self.tenures.items():
            by_group[group].extend(held)
        for (group, partition), held in self.tenures.items():
            for index, tenure in enumerate(held):
                free_from = tenure.valid_until(self.lease_ms)
                later = [t for t in held[index + 1:] if t.start_ms + LEASE_SLACK_MS >= free_from]
                if len(later) < len(held) - index - 1:
                    continue  # taken before it was free (I11's), or again by its holder
                if not later:
                    continue  # never taken again: I3's, if anything waited
                deadline = self._deadline(free_from, tenure.runner)
                taken = later[0].start_ms
                if taken <= deadline + LEASE_SLACK_MS:
                    continue
                others = [t for t in by_group[group] if t is not tenure
                          and t.start_ms <= deadline and t.renewed_ms >= free_from]
                if not others:
                    continue  # nobody held anything of the group: nobody could take it
                if not self._work_waited(group, partition, free_from, deadline):
                    continue
                yield (f"{group}/{partition}: free from {free_from:.0f} (database clock), "
                       f"taken only at {taken:.0f}, with messages waiting, although "
                       f"{others[0].holder} held a lease of {group} meanwhile "
                       f"(deadline {deadline:.0f})",
                       [*tenure.events[-2:], *later[0].events[:1]])

    # -- helpers ---------------------------------------------------------------------------
    def _work_waited(self, group: str, partition: str, free_from: float,
                     deadline: float) -> bool:
        """Was a message of ``partition``, committed before ``deadline``, first run by
        ``group`` after the deadline, and not before ``free_from``?"""
        if self._first_runs is None:
            first: dict[tuple[str, str, str], float] = {}
            for run in self.history.runs:
                key = (run.group, run.partition, run.id)
                first[key] = min(first.get(key, run.started_ms), run.started_ms)
            self._first_runs = defaultdict(list)
            for publish in self.history.publishes:
                if publish.committed and publish.created:
                    for g in self.history.groups:
                        start = first.get((g, publish.partition, publish.id))
                        if start is not None:
                            self._first_runs[(g, publish.partition)].append(
                                (publish.ended_ms, start))
        return any(committed <= deadline and start > deadline + LEASE_SLACK_MS
                   and start >= free_from
                   for committed, start in self._first_runs[(group, partition)])

    def _deadline(self, free_from: float, holder_runner: str) -> float:
        """A lease after ``free_from``; or, after a fault of another runner or of the
        database that ends less than a lease before the deadline, a lease and a renew
        interval after its end: a killed or frozen member still counts in the fair
        shares until its heartbeat runs out (a lease after its last one), and the others
        take its share at their next renewal. A fault of the holder's own that began
        before the lease ended moves nothing (a holder frozen past its lease is the case
        at hand); one that began after, as any other (it released the lease, and is one
        of those who could take it again)."""
        renew = float(self.history.renew_ms or 0)
        deadline = free_from + self.lease_ms
        faults = sorted((f for f in self.history.faults
                         if f.runner != holder_runner or f.began_ms >= free_from),
                        key=lambda f: f.began_ms)
        for fault in faults:
            if fault.began_ms > deadline:
                break
            if fault.ended_ms + self.lease_ms + renew >= free_from:
                deadline = max(deadline, fault.ended_ms + self.lease_ms + renew)
        return deadline

    def _renewed_at_least(self, tenure: Tenure) -> float:
        """The earliest its latest renewal can have been. The recorded time is the row's
        age, as the tick read it, taken from the time of the log record: a pause of the
        holder's process between the read and the record (a recorded pause of its
        runner that ended after the recorded time and within a lease of it) makes it
        late by up to the pause's length (the soak's PostgreSQL run of issue 51: a
        subscriber stopped for 8 s there looked as if it had renewed 9 s late)."""
        late = sum(f.ended_ms - f.began_ms for f in self.history.faults
                   if f.kind == "pause" and f.runner == tenure.runner
                   and tenure.renewed_ms <= f.ended_ms <= tenure.renewed_ms + self.lease_ms)
        return tenure.renewed_ms - late

    def _server_changed(self, since: float, until: float) -> bool:
        """Did a failover or a restart of the database (which voids the old grants on
        a new server) happen between ``since`` and ``until``?"""
        return any(f.kind in ("failover", "outage") and f.began_ms <= until
                   and f.ended_ms >= since - LEASE_SLACK_MS for f in self.history.faults)


def describe(event: LeaseEvent) -> str:
    return (f"lease {event.group}/{event.partition} {event.change} by {event.holder} "
            f"(runner {event.runner}, generation {event.generation}, tenure {event.tenure}) "
            f"at {event.at_ms:.0f}" + (f", {event.renewals} renewal(s)"
                                       if event.renewals else ""))
