"""This host's clocks: the monotonic clock of timers and deadlines, the wall clock of
reported times, and sleeping (``HostClock``). The package's parts that read time are
given one (``host_clock=``; default ``SYSTEM_CLOCK``, the ``time`` module's), so that a
test passes a manual clock instead of patching ``time`` for the whole process. A leaf:
imports no other part of the package (the wake-ups, the publishing path, the engine and
the operations all use it). The database's clock is ``sqlqueue.consuming.clock``'s.
"""

from __future__ import annotations

import time
from typing import Protocol


class HostClock(Protocol):
    """This host's clocks."""

    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward (timers, deadlines)."""
        ...

    def wall(self) -> float:
        """Epoch seconds on this host's clock (durations and delays reported)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (on a manual clock: move it)."""
        ...


class SystemClock:
    """The ``time`` module's clocks: what the engine reads unless given another."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


#: the default ``HostClock``
SYSTEM_CLOCK = SystemClock()
