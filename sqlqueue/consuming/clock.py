"""The database clock, read once in a while and extrapolated with a monotonic clock.

Every lease, visibility and backoff decision uses database time (SPEC I11), so workers
whose wall clocks are wrong neither take over leases nor redeliver early. Reading the
server's time for every decision would cost a round trip each; instead the clock is
re-anchored every few seconds and extrapolated in between with ``time.monotonic()``,
which only measures elapsed time and ignores wall-clock jumps.

The clock is never behind the database's: the monotonic anchor is taken *before* the
database is asked, so the extrapolation is ahead by at most one round trip. That is the
safe side for every use: a visibility timeout or a backoff ends a little later, and a time
stamped after a read (``covered_at_ms``, SPEC I4) is never earlier than the read.

It is cheap to read (no query between re-anchors), so callers read it again after any
statement that may have waited for a lock instead of carrying one reading through a
whole cycle (a reading taken before a wait is seconds stale after it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

REANCHOR_SECONDS = 5.0


class DatabaseClock:
    def __init__(self, read_database_ms: Callable[[], int],
                 reanchor_seconds: float = REANCHOR_SECONDS) -> None:
        self._read = read_database_ms
        self._every = reanchor_seconds
        self._anchor_ms = 0
        self._anchor_mono = -float("inf")

    def now_ms(self) -> int:
        elapsed = time.monotonic() - self._anchor_mono
        if elapsed >= self._every:
            asked_at = time.monotonic()
            self._anchor_ms = self._read()
            self._anchor_mono = asked_at
            elapsed = time.monotonic() - asked_at
        return self._anchor_ms + int(elapsed * 1000)

    def invalidate(self) -> None:
        """Re-read the database on the next call (after a reconnect)."""
        self._anchor_mono = -float("inf")
