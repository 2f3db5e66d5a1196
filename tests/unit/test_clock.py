"""The database clock's readings (sqlqueue.consuming.clock), without a database."""

from __future__ import annotations

import pytest

from sqlqueue.consuming.clock import DatabaseClock
from tests.manual_clock import ManualSeconds


@pytest.fixture
def monotonic() -> ManualSeconds:
    return ManualSeconds(100.0)


def test_the_database_is_asked_once_in_a_while(monotonic: ManualSeconds) -> None:
    reads: list[int] = []

    def read() -> int:
        reads.append(1)
        return 1_000_000

    clock = DatabaseClock(read, reanchor_seconds=5, host_clock=monotonic)
    assert clock.now_ms() == 1_000_000
    monotonic.now += 2.5
    assert clock.now_ms() == 1_002_500 and len(reads) == 1  # extrapolated
    monotonic.now += 2.5
    assert clock.now_ms() == 1_000_000 and len(reads) == 2  # asked again
    clock.invalidate()
    assert clock.now_ms() == 1_000_000 and len(reads) == 3  # a reconnect: asked at once


def test_an_estimate_never_asks_the_database(monotonic: ManualSeconds) -> None:
    answers = iter([1_000_000])
    clock = DatabaseClock(lambda: next(answers), reanchor_seconds=5,
                          host_clock=monotonic)
    clock.now_ms()
    clock.invalidate()  # the next now_ms asks; an estimate still extrapolates
    monotonic.now += 60
    assert clock.estimate_ms() == 1_060_000
