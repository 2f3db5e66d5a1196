"""What a run of sqlqueue under test did, as plain data: the history a checker reads.

Publishers record each publish (begun, its commit begun, committed or rolled back, with
its offset and id); handlers record each run (which message, attempt, runner, when it
started and ended, how); the harness records the faults it made (kills, pauses,
database outages, lock stalls, failovers) and, at the end, what the surviving database
holds (acks, dead letters, stored messages). Subscribers' lease events (acquired, renewed,
lost, released: ``LeaseEvent``) come from the ``sqlqueue.lease`` log event
(``tests.history.lease_log``). Times are milliseconds of one clock shared by
every recorder of a run (the machine's ``time.time()``: every process of a run is on one
machine), so events of different processes can be ordered.

Everything here is JSON-friendly, so that a run's history is written to a file, replayed
and checked again without a database (``History.dump`` / ``History.load``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

#: "uncharged": a message of an ordered batch after one that failed, given back neither
#: acked nor counted as an attempt (it waits behind the failed one)
RunOutcome = Literal["ok", "fail", "retry", "reject", "cut", "uncharged"]
FaultKind = Literal["kill", "pause", "outage", "stall", "failover"]
LeaseChange = Literal["acquired", "renewed", "lost", "released"]


def now_ms() -> float:
    return time.time() * 1000


@dataclass(frozen=True)
class GroupConfig:
    """What the checker needs to know of a consumer group's options."""

    ordered: bool = False
    max_attempts: int = 5
    min_backoff_ms: int = 0
    max_backoff_ms: int = 0
    visibility_ms: int = 60_000


@dataclass(frozen=True)
class Publish:
    """One call of send_message in a transaction of its own (or the caller's)."""

    publisher: str
    topic: str
    partition: str
    id: str
    offset: int | None  # None: the INSERT never returned (the transaction failed first)
    begun_ms: float
    commit_begun_ms: float
    ended_ms: float
    committed: bool
    created: bool = True  # False: the id was stored already (idempotent publish)


@dataclass(frozen=True)
class Run:
    """One handler call; of a batch consumer, one message of the call (every message of a
    batch is a run with the batch's start and end, and the batch's ``batch`` name)."""

    group: str
    topic: str
    partition: str
    offset: int
    id: str
    attempt: int
    runner: str
    started_ms: float
    finished_ms: float | None  # None: never returned (the process was killed)
    outcome: RunOutcome
    #: when this delivery's visibility timeout ends, read by the handler at its start
    #: (None: not read)
    visible_until_ms: float | None = None
    server: str = ""
    #: the handler call this run was part of, of a batch consumer (runner and a number);
    #: "" for a single-message consumer's run
    batch: str = ""


@dataclass(frozen=True)
class Fault:
    """Something the harness did to a runner or the database. ``runner`` is None for
    what touches every runner (a database outage, a failover, a lock stall)."""

    kind: FaultKind
    began_ms: float
    ended_ms: float
    runner: str | None = None


@dataclass(frozen=True)
class LeaseEvent:
    """A subscriber's lease of one (group, partition) changed or was renewed.

    ``at_ms`` of an acquired or renewed lease is when the database last renewed it, by
    the database's clock (what every lease decision reads: the row's age, converted on
    this machine's clock, which the database server shares); of a lost or released one,
    when its holder noticed or gave it up. ``holder`` is the subscriber's name (the lease
    row's owner), ``runner`` the name runs and faults give its process; a ``tenure``
    (numbered per process) is one unbroken holding. ``renewals``: how many renewals this
    one stands for (a history keeps only a tenure's latest)."""

    group: str
    partition: str
    holder: str
    runner: str
    change: LeaseChange
    generation: int | None
    tenure: int | None
    at_ms: float
    renewals: int = 0


@dataclass(frozen=True)
class DeadLetter:
    group: str
    id: str
    attempts: int
    error: str


@dataclass
class FinalState:
    """Read from the surviving database once every runner stopped."""

    #: (group, partition, offset) acked in delivery state, or below the group's watermark
    acked: set[tuple[str, str, int]] = field(default_factory=set)
    #: (partition, offset) -> id of every message still stored
    stored: dict[tuple[str, int], str] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: (partition, offset)s that garbage collection may have removed (none if it did not
    #: run): a message missing from ``stored`` is only excused if it is here
    collectable: bool = False
    #: by atomic group, the ids whose handler's own write (made in the transaction that
    #: acks the message) committed; None where the workload makes no such write
    atomic_writes: dict[str, set[str]] | None = None


@dataclass
class History:
    topic: str
    groups: dict[str, GroupConfig]
    publishes: list[Publish] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    final: FinalState = field(default_factory=FinalState)
    seed: int | None = None
    #: a lock stall at least this long can make leases expire (their renewal waits on
    #: it: LEASE_DURATION - LEASE_RENEW_INTERVAL), and partitions change hands with
    #: outcomes unrecorded: such a stall excuses a redelivery as a pause would (None:
    #: stalls never excuse one)
    lease_at_risk_ms: int | None = None
    leases: list[LeaseEvent] = field(default_factory=list)
    #: the subscribers' LEASE_DURATION and LEASE_RENEW_INTERVAL, in ms (None: no lease
    #: events recorded, the lease rules I11/I12 check nothing)
    lease_ms: int | None = None
    renew_ms: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: (group, partition, holder, tenure) -> the index in ``leases`` of its latest renewal
    _renewed_at: dict[tuple[str, str, str, int | None], int] = field(
        default_factory=dict, repr=False, compare=False)

    # -- recording (thread-safe) --------------------------------------------------------
    def published(self, publish: Publish) -> None:
        with self._lock:
            self.publishes.append(publish)

    def ran(self, run: Run) -> None:
        with self._lock:
            self.runs.append(run)

    def settled(self, recorded: list[Run], runs: list[Run]) -> None:
        """``runs`` in place of ``recorded`` (an atomic call's, recorded cut until its
        transaction commits)."""
        with self._lock:
            kept = {id(run) for run in recorded}
            self.runs[:] = [run for run in self.runs if id(run) not in kept] + runs

    def faulted(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def leased(self, event: LeaseEvent) -> None:
        """Record a lease event; a renewal replaces the tenure's renewal before it (the
        checker reads a tenure's start, its latest renewal and its end)."""
        with self._lock:
            key = (event.group, event.partition, event.holder, event.tenure)
            if event.change != "renewed":
                self._renewed_at.pop(key, None)
                self.leases.append(event)
                return
            index = self._renewed_at.get(key)
            if index is None:
                self._renewed_at[key] = len(self.leases)
                self.leases.append(dataclasses.replace(event, renewals=max(1, event.renewals)))
            else:
                before = self.leases[index]
                self.leases[index] = dataclasses.replace(
                    event, at_ms=max(before.at_ms, event.at_ms),
                    renewals=before.renewals + max(1, event.renewals))

    @property
    def events(self) -> int:
        return len(self.publishes) + len(self.runs) + len(self.faults) + len(self.leases)

    # -- files ----------------------------------------------------------------------------
    def dump(self, path: Path) -> None:
        final = {"acked": sorted(self.final.acked),
                 "stored": [[p, o, i] for (p, o), i in sorted(self.final.stored.items())],
                 "dead_letters": [asdict(d) for d in self.final.dead_letters],
                 "collectable": self.final.collectable,
                 "atomic_writes": None if self.final.atomic_writes is None else {
                     g: sorted(ids) for g, ids in self.final.atomic_writes.items()}}
        path.write_text(json.dumps({
            "topic": self.topic, "seed": self.seed, "lease_at_risk_ms": self.lease_at_risk_ms,
            "groups": {g: asdict(c) for g, c in self.groups.items()},
            "publishes": [asdict(p) for p in self.publishes],
            "runs": [asdict(r) for r in self.runs],
            "faults": [asdict(f) for f in self.faults],
            "leases": [asdict(e) for e in self.leases],
            "lease_ms": self.lease_ms, "renew_ms": self.renew_ms,
            "final": final,
        }))

    @classmethod
    def load(cls, path: Path) -> History:
        data = json.loads(path.read_text())
        final = data["final"]
        return cls(
            topic=data["topic"], seed=data.get("seed"),
            lease_at_risk_ms=data.get("lease_at_risk_ms"),
            groups={g: GroupConfig(**c) for g, c in data["groups"].items()},
            publishes=[Publish(**p) for p in data["publishes"]],
            runs=[Run(**r) for r in data["runs"]],
            faults=[Fault(**f) for f in data["faults"]],
            leases=[LeaseEvent(**e) for e in data.get("leases", [])],
            lease_ms=data.get("lease_ms"), renew_ms=data.get("renew_ms"),
            final=FinalState(
                acked={(g, p, o) for g, p, o in final["acked"]},
                stored={(p, o): i for p, o, i in final["stored"]},
                dead_letters=[DeadLetter(**d) for d in final["dead_letters"]],
                collectable=final["collectable"],
                atomic_writes=None if final.get("atomic_writes") is None else {
                    g: set(ids) for g, ids in final["atomic_writes"].items()}),
        )


def runs_from_lines(lines: Iterable[str]) -> list[Run]:
    """Runs written one JSON object a line (by handlers in other processes)."""
    return [Run(**json.loads(line)) for line in lines if line.strip()]


def run_line(run: Run) -> str:
    return json.dumps(asdict(run)) + "\n"


def as_dict(value: Any) -> dict[str, Any]:
    return asdict(value)
