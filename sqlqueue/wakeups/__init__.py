"""Wake-ups: a committed publish ends a waiting ``runconsumer``'s sleep at once, so that
latency is not a poll interval.

This package sits below both ``sqlqueue.publishing`` and ``sqlqueue.consuming`` (the
publisher rings, the runner listens; neither imports the other). It holds:

* the in-process registry (``subscribe``/``ring``): a publish committed in a process wakes
  that process's runners consuming the topic (tests, a Tasks ``enqueue`` in a worker);
* ``Doorbell``, the runner's wait between passes, where many rings are one wake-up;
* the channels between processes: PostgreSQL ``LISTEN`` (``sqlqueue.wakeups.postgresql``)
  and Redis pub/sub (``sqlqueue.wakeups.redis``).

Wake-ups are hints: a lost one costs at most a poll interval, never a message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

logger = logging.getLogger("sqlqueue.wakeups")

#: called with the topic that received a committed message
Ring = Callable[[str], None]

_lock = threading.Lock()
_by_topic: dict[str, list[Ring]] = {}


def subscribe(topics: Iterable[str], ring: Ring) -> Callable[[], None]:
    """Call ``ring(topic)`` whenever a publish to one of ``topics`` commits in this
    process; returns the function that unsubscribes."""
    chosen = set(topics)
    with _lock:
        for topic in chosen:
            _by_topic.setdefault(topic, []).append(ring)

    def unsubscribe() -> None:
        with _lock:
            for topic in chosen:
                rings = _by_topic.get(topic, [])
                if ring in rings:
                    rings.remove(ring)
                if not rings:
                    _by_topic.pop(topic, None)

    return unsubscribe


def subscribed(topic: str) -> bool:
    """Does a runner of this process wait for ``topic``? Read without the lock: a
    subscriber added while a publish asks misses at most that ring."""
    return topic in _by_topic


def ring(topics: Iterable[str]) -> int:
    """Wake this process's subscribers of ``topics``; returns how many calls were made.
    A subscriber that raises is logged and skipped: publishing has committed already."""
    with _lock:
        calls = [(topic, r) for topic in set(topics) for r in _by_topic.get(topic, ())]
    for topic, callback in calls:
        try:
            callback(topic)
        except Exception:  # a hint must never fail the publisher's commit hook
            logger.exception("A wake-up subscriber of %r failed.", topic)
    return len(calls)


class Doorbell:
    """The runner's wait between passes: ``threading.Event``'s ``set``/``wait``/``clear``,
    plus ``ring`` for a publish.

    ``set`` (a handler finished, a stop was asked for) ends a wait at once. ``ring`` ends
    it too, but never sooner than ``min_gap`` seconds after the wait began (the end of the
    previous pass): rung any number of times, it is one wake-up, and a storm of publishes
    makes a busy runner poll no more often than the adaptive loop's quickest cadence.
    """

    def __init__(self, min_gap: float) -> None:
        self.min_gap = min_gap
        self._condition = threading.Condition()
        self._urgent = False
        self._rung = False
        #: waits a ring ended before their timeout (each one is one early pass)
        self.wakeups = 0
        #: a wait is under way (tests wait for the runner to sleep before publishing)
        self.waiting = False

    def set(self) -> None:
        with self._condition:
            self._urgent = True
            self._condition.notify_all()

    def ring(self, topic: str | None = None) -> None:
        with self._condition:
            self._rung = True
            self._condition.notify_all()

    def clear(self) -> None:
        with self._condition:
            self._urgent = self._rung = False

    def is_set(self) -> bool:
        with self._condition:
            return self._urgent or self._rung

    def wait(self, timeout: float, *, coalesce: bool = True) -> bool:
        """Wait up to ``timeout`` seconds; True if ``set`` or ``ring`` ended it (or had
        been called since the last ``clear``). ``coalesce=False``: a ring ends it at once
        too (after a pass that delivered nothing there is no stream to gather rings of,
        and the gap would only delay the message that rang)."""
        started = time.monotonic()
        deadline = started + timeout
        with self._condition:
            self.waiting = True
            try:
                self._wait_until(started if coalesce else started - self.min_gap, deadline)
            finally:
                self.waiting = False
            if self._rung and not self._urgent and time.monotonic() < deadline:
                self.wakeups += 1
            return self._urgent or self._rung

    def _wait_until(self, started: float, deadline: float) -> None:
        """Inside the condition's lock: until ``set``, ``deadline``, or a ring and
        ``min_gap`` after ``started``."""
        while not self._urgent:
            end = min(deadline, started + self.min_gap) if self._rung else deadline
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._condition.wait(remaining)
