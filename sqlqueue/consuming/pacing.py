"""When the runner's next pass comes, and the write horizon its passes use.

Adaptive polling: after a pass that saw new messages the next poll comes
``FIRST_QUICK_POLL`` later, then twice as late after each quiet one, up to POLL_INTERVAL;
sooner if a message, a retry or a timer is due earlier. Not while a wake-up channel hears
other processes' publishes (``Wakeups.cover_other_processes``): each commit rings then.
``Runner`` owns one ``Pacer``; what it reads of the runner (its handler pool, its
subscribers, which are paused) is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import Clock
from sqlqueue.consuming.handoff import HandlerPool
from sqlqueue.consuming.subscriber import Subscriber

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


class Pacer:
    """When the runner's next pass comes."""

    def __init__(self, *, conf: QueueSettings, clock: Clock, pool: HandlerPool,
                 subscribers: list[Subscriber], paused: Callable[[Subscriber], bool],
                 until_empty: bool, max_messages: int | None) -> None:
        self.conf = conf
        self.clock = clock
        self.pool = pool
        self.subscribers = subscribers
        self.paused = paused
        self.until_empty = until_empty
        self.max_messages = max_messages
        #: periodic jobs run on the main thread between passes (the schedules' ticker)
        self.timers: list[Timer] = []
        #: a wake-up channel hears every other process's publishes (set once it listens)
        self.covered_by_wakeups: Callable[[], bool] = lambda: False
        self._quiet_passes = 0  # passes in a row that saw no new message
        self._last_head = -1
        self._dispatched_before = 0

    def add_timer(self, timer: Timer) -> None:
        self.timers.append(timer)

    def rely_on(self, covered_by_wakeups: Callable[[], bool]) -> None:
        """The wake-up listeners exist: ``covered_by_wakeups`` tells whether they hear
        every other process's publishes (polls may then slow down)."""
        self.covered_by_wakeups = covered_by_wakeups

    def run_timers(self, delay: float) -> float:
        """Run the timers that are due; return ``delay`` shortened to the next one's time."""
        for timer in self.timers:
            timer.run_due()
            due = timer.next_due_ms()
            if due is not None:
                delay = min(delay, max(0.0, (due - self.clock.now_ms()) / 1000))
        return delay

    def next_delay(self, head: Callable[[], int]) -> float | None:
        """How long to wait before the next pass (None: an ``until_empty`` or
        ``max_messages`` runner has nothing left to do)."""
        pool = self.pool
        if self.max_messages is not None and pool.dispatched >= self.max_messages:
            if pool.in_flight == 0:
                return None
        elif self.until_empty and pool.in_flight == 0 and not pool.unrecorded and all(
            s.caught_up(head) and not s.busy() for s in self.subscribers
        ):
            return None
        if pool.has_outcomes():
            return 0.0
        if any(s.reads_on() for s in self.subscribers if not self.paused(s)):
            return 0.0
        delay = self.polling_delay(head)
        dues = [d for d in (s.next_due_ms() for s in self.subscribers if not self.paused(s))
                if d is not None]
        if dues:
            delay = min(delay, max(0.0, (min(dues) - self.clock.now_ms()) / 1000))
        return delay

    def polling_delay(self, head: Callable[[], int]) -> float:
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
        active = moved or self.pool.dispatched != self._dispatched_before
        self._dispatched_before = self.pool.dispatched
        self._quiet_passes = 0 if active else min(self._quiet_passes + 1, 30)
        if self.covered_by_wakeups():
            return float(self.conf.POLL_INTERVAL)
        return float(min(self.conf.POLL_INTERVAL, FIRST_QUICK_POLL * 2.0 ** self._quiet_passes))
