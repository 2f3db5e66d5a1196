"""The shapes of lag: where a group stands on one partition (``PartitionLag``) and on a
topic (``GroupLag``), and how statuses rank (``SEVERITY``, ``worst``).

``sqlqueue.operations.lag`` computes them and holds the status rules; the admin, the
metrics and ``manage.py queue status`` show them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlqueue.operations import COUNT_CAP

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
