"""The tests' manual database clock: one class for the integration tests' runners
(``tests/integration/consuming_helpers.py``) and the in-memory engine
(``tests/engine/harness.py``)."""

from __future__ import annotations


class ManualClock:
    """Database time that moves only when told (a ``Clock``: ``Runner(clock=...)``): a
    test passes visibility timeouts by moving it, never by sleeping past them. It is a
    ``HostClock`` too (``Runner(host_clock=...)``, or one part's ``host_clock``): its
    monotonic and wall clocks are the same milliseconds, and a ``sleep`` moves it."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def now_ms(self) -> int:
        return self.ms

    def estimate_ms(self) -> int:
        return self.ms

    def invalidate(self) -> None:
        pass

    def monotonic(self) -> float:
        return self.ms / 1000

    def wall(self) -> float:
        return self.ms / 1000

    def sleep(self, seconds: float) -> None:
        self.advance(round(seconds * 1000))

    def advance(self, milliseconds: int) -> None:
        assert milliseconds >= 0, "the clock only moves forward"
        self.ms += milliseconds


class ManualSeconds:
    """A ``HostClock`` at ``now`` seconds that moves only when a test moves it (``now``
    is a float: parts that read monotonic seconds are tested at fractions of one)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
