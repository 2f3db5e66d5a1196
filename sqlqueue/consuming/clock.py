"""The database clock, read once in a while and extrapolated with a monotonic clock.

Every lease, visibility and backoff decision uses database time (guarantee I11), so workers
whose wall clocks are wrong neither take over leases nor redeliver early. Reading the
server's time for every decision would cost a round trip each; instead the clock is
re-anchored every few seconds and extrapolated in between with ``time.monotonic()``,
which only measures elapsed time and ignores wall-clock jumps.

The clock is never behind the database's: the monotonic anchor is taken *before* the
database is asked, so the extrapolation is ahead by at most one round trip. That is the
safe side for every use: a visibility timeout or a backoff ends a little later, and a time
stamped after a read (``covered_at_ms``, guarantee I4) is never earlier than the read.

It is cheap to read (no query between re-anchors), so callers read it again after any
statement that may have waited for a lock instead of carrying one reading through a
whole cycle (a reading taken before a wait is seconds stale after it).

The runner takes any ``Clock`` (``Runner(clock=...)``): tests drive visibility timeouts
with one that moves only when told, instead of sleeping past real ones.

This host's own clocks (the monotonic clock of timers and deadlines, the wall clock of
reported durations, and sleeping) are a ``HostClock``, passed to every part of the engine
that reads time (``Runner(host_clock=...)``); they are defined in ``sqlqueue.clocks``,
the one module of the package's time-reading layers that reads the ``time`` module
(tests/unit/test_injected_time.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# This host's clocks live below every layer (sqlqueue.clocks): the engine's parts import
# them from here, the wake-ups, the publishing path and the operations from there.
from sqlqueue.clocks import SYSTEM_CLOCK as SYSTEM_CLOCK
from sqlqueue.clocks import HostClock as HostClock
from sqlqueue.clocks import SystemClock as SystemClock

REANCHOR_SECONDS = 5.0


class Clock(Protocol):
    """Database time, in epoch milliseconds."""

    def now_ms(self) -> int:
        """Now, on the runner's main thread (may ask the database, on its connection)."""
        ...

    def estimate_ms(self) -> int:
        """Now, on any thread and never asking the database (a handler's
        ``extend_visibility``): extrapolated from the last reading."""
        ...

    def invalidate(self) -> None:
        """Ask the database again at the next ``now_ms`` (a reconnect, another server)."""
        ...


class DatabaseClock:
    def __init__(self, read_database_ms: Callable[[], int],
                 reanchor_seconds: float = REANCHOR_SECONDS, *,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self._host = host_clock
        self._read = read_database_ms
        self._every = reanchor_seconds
        # (database ms, monotonic seconds when it was asked), replaced as one value so
        # that another thread never sees half of a new anchor
        self._anchor = (0, -float("inf"))
        self._stale = True

    def now_ms(self) -> int:
        anchor_ms, anchor_mono = self._anchor
        if self._stale or self._host.monotonic() - anchor_mono >= self._every:
            asked_at = self._host.monotonic()
            self._anchor = anchor_ms, anchor_mono = self._read(), asked_at
            self._stale = False
        return anchor_ms + int((self._host.monotonic() - anchor_mono) * 1000)

    def estimate_ms(self) -> int:
        anchor_ms, anchor_mono = self._anchor
        if anchor_mono == -float("inf"):
            return int(self._host.wall() * 1000)  # never read yet: this host's clock
        return anchor_ms + int((self._host.monotonic() - anchor_mono) * 1000)

    def invalidate(self) -> None:
        self._stale = True
