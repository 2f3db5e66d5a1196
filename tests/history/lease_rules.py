"""The history checker's lease rules (docs/reference/guarantees.md), on the lease events a
history recorded (``History.leases``: acquired, renewed, lost, released):

* **I11** one clock: by the database's clock, a partition's lease changes hands only
  once the previous holder's lease ran out (its last renewal + ``LEASE_DURATION``) or
  was released: no two tenures of one partition overlap, whatever the workers' clocks
  say. A failover or a database restart excuses it (the new server voids the old one's
  grants, ``consuming/takeover.py``).
* **I12** (its availability half) no partition is left unowned longer than about a
  lease after its holder's lease ran out or was released: another subscriber, or the
  holder itself, takes it within ``LEASE_DURATION`` more, unless nobody could (no
  subscriber of the group held anything meanwhile) or a fault of the others or of the
  database (a kill, a pause, an outage, a lock stall) came in between; each such fault
  moves the deadline to a lease after its end. The fair-share counts themselves are
  ``tests/acceptance/test_distribution.py``'s.

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

    def valid_until(self, lease_ms: float) -> float:
        """Until when the database let nobody else take it."""
        if self.released_ms is not None:
            return min(self.released_ms, self.renewed_ms + lease_ms)
        return self.renewed_ms + lease_ms


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

    def one_clock(self) -> Iterator[tuple[str, list[LeaseEvent]]]:
        """I11: (text, events) of each tenure that began while an earlier one of its
        partition was still valid by the database clock."""
        for (group, partition), held in self.tenures.items():
            for index, later in enumerate(held):
                for earlier in held[:index]:
                    until = earlier.valid_until(self.lease_ms)
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
                deadline = self._deadline(free_from, tenure.runner)
                taken = later[0].start_ms if later else None
                if taken is not None and taken <= deadline + LEASE_SLACK_MS:
                    continue
                others = [t for t in by_group[group] if t is not tenure
                          and t.start_ms <= deadline and t.renewed_ms >= free_from]
                if not others:
                    continue  # nobody held anything of the group: nobody could take it
                if taken is None and not any(t.start_ms > deadline
                                             for t in by_group[group]):
                    continue  # the end of the run: nobody acquired anything after
                yield (f"{group}/{partition}: free from {free_from:.0f} (database clock), "
                       + ("never taken again" if taken is None else
                          f"taken only at {taken:.0f}")
                       + f" although {others[0].holder} held a lease of {group} meanwhile "
                       f"(deadline {deadline:.0f})",
                       [*tenure.events[-2:], *(later[0].events[:1] if later else [])])

    # -- helpers ---------------------------------------------------------------------------
    def _deadline(self, free_from: float, holder_runner: str) -> float:
        """A lease after ``free_from``, or after the end of any fault that overlaps the
        wait (one of the holder's own does not: a frozen holder is the case at hand)."""
        deadline = free_from + self.lease_ms
        faults = sorted((f for f in self.history.faults if f.runner != holder_runner),
                        key=lambda f: f.began_ms)
        for fault in faults:
            if fault.began_ms > deadline:
                break
            if fault.ended_ms >= free_from:
                deadline = max(deadline, fault.ended_ms + self.lease_ms)
        return deadline

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
