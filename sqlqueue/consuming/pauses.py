"""Pauses made by an operator (``queue pause``), as a running subscriber sees them.

The pauses live in ``queue_flow_control``, a table of a handful of rows. A runner reads it
whole at most once every ``PAUSE_CHECK_INTERVAL`` seconds (one short statement a second
on an idle poll, not one a cycle), so a pause takes effect within about a second, and a
handler already running finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock

#: Seconds between two reads of the pauses by a running subscriber. Nothing new starts
#: within 2 s of a pause ("within about a second": docs/guides/operations.md, "Pause and
#: resume"); one read a second leaves a second for the handler threads to see it.
PAUSE_CHECK_INTERVAL = 1.0

Pause = tuple[str, str]  # (group, topic); "" matches any


def matches(pauses: Iterable[Pause], group: str, topic: str) -> bool:
    """Whether any pause covers ``group`` on ``topic`` ("" in a pause matches any)."""
    return any(g in ("", group) and t in ("", topic) for g, t in pauses)


def stored_pauses(alias: str) -> Callable[[], list[Pause]]:
    """What a runner's ``PauseWatch`` reads: the pauses in ``alias``'s table. Django is
    imported here, not with the module: the Spark executors import this module (its
    ``matches``) and must not import Django."""
    from django.db import connections

    from sqlqueue import storage

    def read() -> list[Pause]:
        connection = connections[alias]
        with connection.cursor() as cursor:
            return storage.store(connection).list_pauses(cursor)

    return read


class PauseWatch:
    """The pauses a runner last read, refreshed when ``PAUSE_CHECK_INTERVAL`` is over."""

    def __init__(self, read: Callable[[], list[Pause]],
                 interval: float = PAUSE_CHECK_INTERVAL, *,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self._read = read
        self.interval = interval
        self.pauses: frozenset[Pause] = frozenset()
        self._next_read = 0.0

    def refresh(self) -> bool:
        """Read the pauses again if it is time; True if they changed."""
        now = self.host_clock.monotonic()
        if now < self._next_read:
            return False
        pauses = frozenset(self._read())
        self._next_read = self.host_clock.monotonic() + self.interval
        changed = pauses != self.pauses
        self.pauses = pauses
        return changed

    def paused(self, group: str, topic: str) -> bool:
        # Asked by a handler thread before every delivery: nothing paused costs no scan.
        return bool(self.pauses) and matches(self.pauses, group, topic)
