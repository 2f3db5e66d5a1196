"""advance_clock (issue 38): how far the queue's clock moved, and its undoing. No
database is read here: ``allow_any_database=True`` lets the clock move outside a test
database (tests/integration/test_testing_toolkit.py checks the refusal)."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from sqlqueue.testing import advance_clock as advance_any_clock
from sqlqueue.testing import clock_offset_ms, reset_clock

advance_clock = partial(advance_any_clock, allow_any_database=True)


@pytest.fixture(autouse=True)
def real_time() -> None:
    reset_clock()


def test_moves_add_up_until_reset() -> None:
    advance_clock(1.5)
    advance_clock(timedelta(minutes=1))
    assert clock_offset_ms() == 61_500
    reset_clock()
    assert clock_offset_ms() == 0


def test_as_a_context_manager_the_move_ends_with_the_block() -> None:
    advance_clock(10)
    with advance_clock(5) as move:
        assert (clock_offset_ms(), move.moved_ms) == (15_000, 5_000)
    assert clock_offset_ms() == 10_000


def test_the_clock_never_goes_back() -> None:
    with pytest.raises(ValueError, match="forward only"):
        advance_clock(-1)
    assert clock_offset_ms() == 0
