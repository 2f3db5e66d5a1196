"""The tests' manual database clock: one class for the integration tests' runners
(``tests/integration/consuming_helpers.py``) and the in-memory engine
(``tests/engine/harness.py``)."""

from __future__ import annotations


class ManualClock:
    """Database time that moves only when told (a ``Clock``: ``Runner(clock=...)``): a
    test passes visibility timeouts by moving it, never by sleeping past them."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def now_ms(self) -> int:
        return self.ms

    def estimate_ms(self) -> int:
        return self.ms

    def invalidate(self) -> None:
        pass

    def advance(self, milliseconds: int) -> None:
        assert milliseconds >= 0, "the clock only moves forward"
        self.ms += milliseconds
