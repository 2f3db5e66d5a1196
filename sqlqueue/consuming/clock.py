"""The database clock, read once in a while and extrapolated with a monotonic clock.

Every lease, visibility and backoff decision uses database time (SPEC I11), so workers
whose wall clocks are wrong neither take over leases nor redeliver early. Reading the
server's time for every decision would cost a round trip each; instead the clock is
re-anchored every few seconds and extrapolated in between with ``time.monotonic()``,
which only measures elapsed time and ignores wall-clock jumps.
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
            self._anchor_ms = self._read()
            self._anchor_mono = time.monotonic()
            elapsed = 0.0
        return self._anchor_ms + int(elapsed * 1000)

    def invalidate(self) -> None:
        """Re-read the database on the next call (after a reconnect)."""
        self._anchor_mono = -float("inf")
