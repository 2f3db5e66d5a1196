"""A flood's log lines (sqlqueue.consuming.logholding.FailureLog): one line per
subscription and kind per interval, with a count and the latest failure (issue 56)."""

from __future__ import annotations

import logging

import pytest

from sqlqueue import events
from sqlqueue.consuming.logholding import (
    DEAD_LETTER_LINES,
    FAILURE_LOG_INTERVAL_SECONDS,
    HANDLER_FAILURE_LINES,
    Failure,
    FailureLog,
)


class Seconds:
    """A monotonic clock that moves when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "event")]


def failure(n: int) -> Failure:
    return Failure("k", n, 1, f"ValueError: {n}", "")


def test_a_flood_is_a_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Seconds()
    log = FailureLog(HANDLER_FAILURE_LINES, name="h", group="g", topic="t", monotonic=clock)
    caplog.set_level(logging.DEBUG, logger="sqlqueue.consumer")
    for n in range(1, 1001):
        log.note(failure(n))
        log.flush()
    # The first at once, with its detail; the other 999 counted.
    (first,) = lines(caplog)
    assert (first.event, first.levelno, first.count, first.offset) == (
        events.HANDLER_FAILURES, logging.WARNING, 1, 1)
    assert first.getMessage() == "Handler h failed on t/k@1 (attempt 1): ValueError: 1"
    clock.now += FAILURE_LOG_INTERVAL_SECONDS
    log.flush()
    _, summary = lines(caplog)
    assert (summary.count, summary.offset, summary.error) == (999, 1000, "ValueError: 1000")
    assert summary.getMessage().startswith("Handler h failed 999 times in the last 10s; "
                                           "the latest on t/k@1000")
    log.flush()
    clock.now += FAILURE_LOG_INTERVAL_SECONDS
    log.flush()
    assert len(lines(caplog)) == 2  # nothing counted: no line


def test_after_a_quiet_interval_the_next_failure_is_told_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Seconds()
    log = FailureLog(DEAD_LETTER_LINES, name="h", group="g", topic="t", monotonic=clock)
    caplog.set_level(logging.ERROR, logger="sqlqueue.consumer")
    log.note(Failure("k", 5, 3, "max_attempts", "task app.send"))
    clock.now += 2 * FAILURE_LOG_INTERVAL_SECONDS
    log.note(Failure("k", 9, 1, "rejected", ""))
    first, second = lines(caplog)
    assert first.getMessage() == ("Dead-lettered t/k@5 (task app.send) for group 'g' after 3 "
                                  "attempt(s) (max_attempts).")
    assert (second.event, second.levelno, second.count, second.offset) == (
        events.DEAD_LETTERS, logging.ERROR, 1, 9)


def test_a_new_kind_of_error_is_told_at_once_within_the_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    """A flood of one error does not hide another (a failover's lost connections beside
    the one ``DeliveredByAnotherServer`` an operator must see): the first of each kind in
    an interval is its own line; more of a kind already told are counted."""
    clock = Seconds()
    log = FailureLog(HANDLER_FAILURE_LINES, name="h", group="g", topic="t", monotonic=clock)
    caplog.set_level(logging.WARNING, logger="sqlqueue.consumer")
    log.note(Failure("k", 1, 1, "OperationalError: lost", ""))
    log.note(Failure("k", 2, 1, "OperationalError: lost", ""))
    log.note(Failure("k", 3, 1, "DeliveredByAnotherServer: was delivered by another", ""))
    log.note(Failure("k", 4, 1, "DeliveredByAnotherServer: was delivered by another", ""))
    told = lines(caplog)
    assert [(line.offset, line.count) for line in told] == [(1, 1), (3, 1)]
    clock.now += FAILURE_LOG_INTERVAL_SECONDS
    log.flush()
    assert [(line.offset, line.count) for line in lines(caplog)][-1] == (4, 2)
