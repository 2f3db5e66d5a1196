"""The queue's clock as tests see it: the database's, moved forward on request.

Every decision of when a message may be delivered (a retry's backoff, a scheduled
``delay``/``deliver_at``, a visibility timeout) is taken by the runner against the
database clock it reads (guarantee I11). ``run_consumers`` gives its runner that clock plus the
offset ``advance_clock`` adds, so a retry due in an hour is delivered at once after
``advance_clock(3600)``; nothing sleeps. Leases keep the real database time (they are
taken and dropped within one ``run_consumers``).

The offset is process-wide and stays until ``reset_clock()``: the pytest fixtures reset it
after each test, and ``with advance_clock(...)`` resets it when the block ends.
"""

from __future__ import annotations

from datetime import timedelta
from types import TracebackType

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.consuming.clock import DatabaseClock
from sqlqueue.testing.databases import refuse_unless_test_databases

_offset_ms = 0


class ClockMove:
    """What ``advance_clock`` returns: used as a context manager, the move is undone when
    the block ends."""

    def __init__(self, moved_ms: int) -> None:
        self.moved_ms = moved_ms

    def __enter__(self) -> ClockMove:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        global _offset_ms
        _offset_ms -= self.moved_ms


def advance_clock(seconds: float | timedelta, *,
                  allow_any_database: bool = False) -> ClockMove:
    """Move the queue's clock ``seconds`` forward for every later ``run_consumers``.

    Retries and scheduled messages due within that time become deliverable. Only the
    queue's delivery decisions move: ``timezone.now()`` and the database's own clock
    do not (stamps such as ``published_at`` stay real).

    Raises ``NotATestDatabase`` if the queue's database (``SQLQUEUE["DATABASE"]``) is not
    one Django's test setup created, unless ``allow_any_database=True``."""
    global _offset_ms
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if seconds < 0:
        raise ValueError(f"advance_clock() moves the clock forward only; got {seconds!r}")
    if not allow_any_database:
        refuse_unless_test_databases("advance_clock()", [get_settings().DATABASE])
    moved = round(seconds * 1000)
    _offset_ms += moved
    return ClockMove(moved)


def reset_clock() -> None:
    """Back to the database's own time."""
    global _offset_ms
    _offset_ms = 0


def clock_offset_ms() -> int:
    """How far ``advance_clock`` moved the queue's clock, in milliseconds."""
    return _offset_ms


def moved_database_clock(alias: str) -> DatabaseClock:
    """The database clock of ``alias``, read on the current connection, plus the offset."""
    def read_ms() -> int:
        connection = connections[alias]
        with connection.cursor() as cursor:
            return storage.store(connection).database_now_ms(cursor) + _offset_ms

    return DatabaseClock(read_ms)
