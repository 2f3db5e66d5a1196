"""When the runner's next pass comes, and the write horizon its passes use.

Adaptive polling: after a pass that saw new messages the next poll comes
``FIRST_QUICK_POLL`` later, then twice as late after each quiet one, up to POLL_INTERVAL;
sooner if a message, a retry or a timer is due earlier. Not while a wake-up channel hears
other processes' publishes (``Wakeups.cover_other_processes``): each commit rings then.
The write horizon (which rows are settled, sqlqueue.horizon) is read at most every
``refresh_delay()`` seconds. A mixin of ``Runner``.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError, connections

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import Clock
from sqlqueue.consuming.handlers import Outcome
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.consuming.wakeups import Wakeups
from sqlqueue.horizon import UNKNOWN, SettledCache, settled_before
from sqlqueue.storage.sql import dialect_for

#: Adaptive polling: after a pass that saw new messages the next poll comes this soon,
#: then twice as late after each quiet one, up to POLL_INTERVAL. Messages arriving
#: steadily are picked up within milliseconds; an idle process still polls once per
#: POLL_INTERVAL (a handful of quick polls after the last message, then no more).
FIRST_QUICK_POLL = 0.002


class _Once:
    """A value computed on first use, then remembered (the log's head, once a pass)."""

    def __init__(self, compute: Callable[[], int]) -> None:
        self._compute = compute
        self._value: int | None = None

    def __call__(self) -> int:
        if self._value is None:
            self._value = self._compute()
        return self._value

    def known(self) -> int | None:
        """The value if it was computed (without computing it)."""
        return self._value


class Timer(Protocol):
    """A periodic job the runner's main thread runs between passes; ``run_due`` must
    handle its own errors (a timer never stops the consumers)."""

    def run_due(self) -> object: ...

    def next_due_ms(self) -> int | None:
        """When ``run_due`` has work next, in the database clock's epoch milliseconds."""
        ...


class Pacing:
    """``Runner``'s timing (it provides what is declared here)."""

    conf: QueueSettings
    alias: str
    clock: Clock
    subscribers: list[Subscriber]
    timers: list[Timer]
    wakeups: Wakeups | None
    max_messages: int | None
    until_empty: bool
    _dispatched: int
    _in_flight: int
    _unrecorded: list[Outcome]
    _done: queue.SimpleQueue[Outcome]

    def __init__(self) -> None:
        self._quiet_passes = 0  # passes in a row that saw no new message (adaptive polling)
        self._last_head = -1
        self._dispatched_before = 0
        self._horizon = SettledCache()

    if TYPE_CHECKING:
        def _paused(self, subscriber: Subscriber) -> bool: ...

    def _run_timers(self, delay: float) -> float:
        """Run the timers that are due; return ``delay`` shortened to the next one's time."""
        for timer in self.timers:
            timer.run_due()
            due = timer.next_due_ms()
            if due is not None:
                delay = min(delay, max(0.0, (due - self.clock.now_ms()) / 1000))
        return delay

    def _next_delay(self, head: Callable[[], int]) -> float | None:
        if self.max_messages is not None and self._dispatched >= self.max_messages:
            if self._in_flight == 0:
                return None
        elif self.until_empty and self._in_flight == 0 and not self._unrecorded and all(
            s.caught_up(head) and not s.busy() for s in self.subscribers
        ):
            return None
        if not self._done.empty() or self._unrecorded:
            return 0.0
        if any(s.reads_on() for s in self.subscribers if not self._paused(s)):
            return 0.0
        delay = self._polling_delay(head)
        dues = [d for d in (s.next_due_ms() for s in self.subscribers if not self._paused(s))
                if d is not None]
        if dues:
            delay = min(delay, max(0.0, (min(dues) - self.clock.now_ms()) / 1000))
        return delay

    def _polling_delay(self, head: Callable[[], int]) -> float:
        """FIRST_QUICK_POLL after a pass that saw new messages (the head moved, or work was
        handed out), doubling with every quiet pass up to POLL_INTERVAL.

        While a wake-up channel hears every publish (``LISTEN``, Redis), POLL_INTERVAL:
        a quick poll would find nothing the channel does not ring for, and each one held
        the main thread for a pass (a fence, the head) that a message committing
        meanwhile waited behind: at 100 messages/s one pass in three was such a poll.
        Rows written without a wake-up (the Spark writer, dead letters) are found at
        the next POLL_INTERVAL poll, as when idle."""
        seen = head.known() if isinstance(head, _Once) else None
        moved = seen is not None and seen != self._last_head
        if seen is not None:
            self._last_head = seen
        active = moved or self._dispatched != self._dispatched_before
        self._dispatched_before = self._dispatched
        self._quiet_passes = 0 if active else min(self._quiet_passes + 1, 30)
        if self.wakeups is not None and self.wakeups.cover_other_processes():
            return float(self.conf.POLL_INTERVAL)
        return float(min(self.conf.POLL_INTERVAL, FIRST_QUICK_POLL * 2.0 ** self._quiet_passes))

    def _settled_before(self, cursor: Any, now_ms: int) -> int | None:
        """Database time before which no publishing transaction is still open, so no row
        can still appear below a settled one (sqlqueue.horizon; None: every visible row
        is settled). Read at most every ``refresh_delay()`` seconds; an older horizon is
        an earlier one, hence still safe.

        Call it right after the fence: its locking read has started the transaction, so a
        fresh INNODB_TRX snapshot lists this connection's own transaction; and no plain
        read has fixed the snapshot yet. Under REPEATABLE READ a horizon read after one
        could pass a writer that committed in between: no longer listed as open, yet
        invisible to this transaction's check of the window (SPEC I4). A horizon cached
        from an earlier transaction was read before this snapshot: safe too."""
        return self._horizon.get(lambda previous: self._read_horizon(cursor, now_ms, previous))

    def _read_horizon(self, cursor: Any, now_ms: int, previous: int | None) -> int | None:
        try:
            seen = dialect_for(connections[self.alias]).write_horizon(cursor)
        except DatabaseError:
            seen = UNKNOWN  # no view of open transactions: assume the longest allowed
        if seen is None:
            return None  # one writer at a time: nothing can commit out of order
        return settled_before(seen, now_ms, round(self.conf.MAX_TRANSACTION_AGE * 1000),
                              previous)

