"""When the runner's next pass comes.

Adaptive polling: after a pass that saw new messages the next poll comes
``FIRST_QUICK_POLL`` later, then twice as late after each quiet one, up to POLL_INTERVAL;
sooner if a message, a retry or a timer is due earlier. Not while a wake-up channel hears
other processes' publishes (``Wakeups.cover_other_processes``): each commit rings then.
``Runner`` owns one ``Pacer``; what it reads of the runner (its handler pool, its
subscribers, its PauseWatch) is passed in; it calls nothing of the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import Clock
from sqlqueue.consuming.handoff import HandlerPool
from sqlqueue.consuming.pauses import PauseWatch
from sqlqueue.consuming.server import Head
from sqlqueue.consuming.subscriber import Subscriber

#: Adaptive polling: after a pass that saw new messages the next poll comes this soon,
#: then twice as late after each quiet one, up to POLL_INTERVAL. Messages arriving
#: steadily are picked up within milliseconds; an idle process still polls once per
#: POLL_INTERVAL (a handful of quick polls after the last message, then no more).
FIRST_QUICK_POLL = 0.002


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
                 subscribers: list[Subscriber], pauses: PauseWatch,
                 until_empty: bool, max_messages: int | None) -> None:
        self.conf = conf
        self.clock = clock
        self.pool = pool
        self.subscribers = subscribers
        self.pauses = pauses
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

    def _unpaused(self) -> list[Subscriber]:
        return [s for s in self.subscribers
                if not self.pauses.paused(s.consumer.group, s.consumer.topic)]

    def next_delay(self, head: Head) -> float | None:
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
        if pool.has_outcomes() and pool.outcomes_due():
            return 0.0
        unpaused = self._unpaused()
        if any(s.fetcher.reads_on() for s in unpaused):
            return 0.0
        delay = self.polling_delay(head)
        dues = [d for d in (s.next_due_ms() for s in unpaused) if d is not None]
        if dues:
            delay = min(delay, max(0.0, (min(dues) - self.clock.now_ms()) / 1000))
        return delay

    def polling_delay(self, head: Head) -> float:
        """FIRST_QUICK_POLL after a pass that saw new messages (the head moved, or work was
        handed out), doubling with every quiet pass up to POLL_INTERVAL.

        While a wake-up channel hears every publish (``LISTEN``, Redis), POLL_INTERVAL:
        a quick poll would find nothing the channel does not ring for, and each one held
        the main thread for a pass (a fence, the head) that a message committing
        meanwhile waited behind: at 100 messages/s one pass in three was such a poll.
        Rows written without a wake-up (the Spark writer, dead letters) are found at
        the next POLL_INTERVAL poll, as when idle."""
        seen = head.known()
        moved = seen is not None and seen != self._last_head
        if seen is not None:
            self._last_head = seen
        active = moved or self.pool.dispatched != self._dispatched_before
        self._dispatched_before = self.pool.dispatched
        self._quiet_passes = 0 if active else min(self._quiet_passes + 1, 30)
        if self.covered_by_wakeups():
            return float(self.conf.POLL_INTERVAL)
        return float(min(self.conf.POLL_INTERVAL, FIRST_QUICK_POLL * 2.0 ** self._quiet_passes))
