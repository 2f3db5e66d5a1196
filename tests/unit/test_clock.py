"""The database clock's readings (sqlqueue.consuming.clock), without a database."""

from __future__ import annotations

import pytest

from sqlqueue.consuming import clock as clock_module
from sqlqueue.consuming.clock import DatabaseClock


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(clock_module.time, "monotonic", lambda: now[0])
    return now


def test_the_database_is_asked_once_in_a_while(monotonic: list[float]) -> None:
    reads: list[int] = []

    def read() -> int:
        reads.append(1)
        return 1_000_000

    clock = DatabaseClock(read, reanchor_seconds=5)
    assert clock.now_ms() == 1_000_000
    monotonic[0] += 2.5
    assert clock.now_ms() == 1_002_500 and len(reads) == 1  # extrapolated
    monotonic[0] += 2.5
    assert clock.now_ms() == 1_000_000 and len(reads) == 2  # asked again
    clock.invalidate()
    assert clock.now_ms() == 1_000_000 and len(reads) == 3  # a reconnect: asked at once


def test_an_estimate_never_asks_the_database(monotonic: list[float]) -> None:
    answers = iter([1_000_000])
    clock = DatabaseClock(lambda: next(answers), reanchor_seconds=5)
    clock.now_ms()
    clock.invalidate()  # the next now_ms asks; an estimate still extrapolates
    monotonic[0] += 60
    assert clock.estimate_ms() == 1_060_000
