"""The per-minute rollup behind the admin's live overview (issue 42): what this runner's
handlers did, counted in memory per (group, topic, minute of database time) and added to
``queue_minute_stats`` by a runner timer (``Pacer.timers``) every few seconds, one upsert
per row in one transaction. Several runners add to the same rows.

It wraps the runner's ``Instruments`` (Prometheus' or none), so it sees exactly the runs
``sqlqueue_handled_total`` and ``sqlqueue_handler_duration_seconds`` count, with the same
outcome labels and duration buckets: the page agrees with ``/metrics``. Besides, per
minute: ``published``, messages first delivered to the group, counted in the minute they
were published (their ``created_at``: the log has no index to count publishes by time,
and runners do not publish); ``dead_lettered``, runs that end in a dead letter (a reject,
or a failure or retry at the last attempt).

Rows older than ``KEEP_MS`` go with garbage collection (``collect_minute_stats``, an extra
collection ``sqlqueue.apps`` registers).
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import Error as AnyDatabaseError
from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.instruments import DURATION_BUCKETS, Instruments

if TYPE_CHECKING:
    from sqlqueue.consuming.handlers import Delivery
    from sqlqueue.consuming.registry import Consumer
    from sqlqueue.consuming.runner import Runner

logger = logging.getLogger("sqlqueue.consumer")

MINUTE_MS = 60_000
#: how often a runner adds what it counted (milliseconds of the database clock)
FLUSH_INTERVAL_MS = 10_000
#: how long rows are kept: the page's longest range (24 h), and a few minutes for late
#: additions; at most 1,450 rows per (group, topic) (issue 53, trial F7: it was 70 minutes)
KEEP_MS = (24 * 60 + 10) * MINUTE_MS
#: the outcomes not counted (as in ``sqlqueue.metrics.ProcessMetrics``)
UNCOUNTED = "not_started"

#: counts of the minute rows not yet written: (group, topic, minute) -> column -> amount
UnwrittenCounts = dict[tuple[str, str, int], dict[str, float]]


_DURATION_COLUMNS = tuple(f"duration_{i:02d}" for i in range(len(DURATION_BUCKETS) + 1))
#: a row's counts before the first run (every column: one upsert statement text per flush)
_EMPTY_ROW: dict[str, float] = {
    "published": 0, "dead_lettered": 0, "ack": 0, "acked": 0, "retry": 0, "fail": 0,
    "reject": 0, "duration_sum": 0.0, **dict.fromkeys(_DURATION_COLUMNS, 0)}
FAILED = ("fail", "retry")


def duration_column(seconds: float) -> str:
    """The column of the histogram bucket a run of ``seconds`` falls in (Prometheus'
    ``le``: a value equal to a bound is in that bound's bucket)."""
    return _DURATION_COLUMNS[bisect_left(DURATION_BUCKETS, seconds)]


class ThreadCounts:
    """One handler thread's rows not yet summed up, under a lock of its own: only that
    thread and the main thread's sum-up (every ``FLUSH_INTERVAL_MS``) take it, so it is
    hardly ever contended."""

    __slots__ = ("lock", "rows")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: UnwrittenCounts = {}

    def take(self) -> UnwrittenCounts:
        with self.lock:
            rows, self.rows = self.rows, {}
        return rows


def _row(rows: UnwrittenCounts, key: tuple[str, str, int]) -> dict[str, float]:
    row = rows.get(key)
    if row is None:
        row = rows[key] = dict(_EMPTY_ROW)
    return row


class MinuteRollup(Instruments):
    """An ``Instruments`` that counts into the rollup and passes every call on to
    ``inner``; also a runner timer that writes the counts."""

    def __init__(self, inner: Instruments, *, alias: str, conf: QueueSettings,
                 now_ms: Callable[[], int], estimate_ms: Callable[[], int],
                 interval_ms: int = FLUSH_INTERVAL_MS,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.inner = inner
        self.alias = alias
        self.conf = conf
        self._now_ms = now_ms  # the main thread's (the timer's)
        self._estimate_ms = estimate_ms  # any thread's (handler threads count)
        self.interval_ms = interval_ms
        self._next_ms = 0
        self._local = threading.local()
        self._threads: list[ThreadCounts] = []  # every counting thread's
        self._threads_lock = threading.Lock()
        self._pending: UnwrittenCounts = {}  # summed up, not yet written (main thread only)
        self._max_attempts: dict[tuple[str, str], int] = {}
        # (the minute's start in database ms, the monotonic second it ends): a handler
        # thread asks the clock once a minute, not at every run
        self._minute = (0, -1.0)
        # The inner instruments' own methods, called directly (no frame of ours per run);
        # ``finished`` is passed on only when the inner instruments do something with it.
        self.handled = inner.handled  # type: ignore[method-assign]
        self._inner_finished = (inner.finished if type(inner).finished
                                is not Instruments.finished else None)

    @classmethod
    def of(cls, runner: Runner) -> MinuteRollup:
        """The rollup of a ``Runner``, wrapping its instruments (its handler pool reports
        to the rollup from now on)."""
        rollup = cls(runner.instruments, alias=runner.alias, conf=runner.conf,
                     now_ms=runner.clock.now_ms, estimate_ms=runner.clock.estimate_ms)
        runner.report_to(rollup)
        return rollup

    # -- counting --------------------------------------------------------------------------
    # Each handler thread counts into rows of its own (one shared lock made the threads
    # queue behind each other on a busy machine: +17 % on a drain; a deque of every run
    # kept thousands of objects alive between sum-ups). The Prometheus counting stays in
    # ``handled``; this is ``finished``, which has the message too.
    def handled(self, group: str, topic: str, outcome: str, duration: float,
                latency: float) -> None:
        self.inner.handled(group, topic, outcome, duration, latency)

    def finished(self, delivery: Delivery, outcome: str, duration: float) -> None:
        if self._inner_finished is not None:
            self._inner_finished(delivery, outcome, duration)
        if outcome == UNCOUNTED:
            return
        consumer, attempt = delivery.consumer, delivery.attempt
        group, topic = consumer.group, consumer.topic
        dead = outcome == "reject" or (outcome in FAILED
                                       and attempt >= self._last_attempt(consumer))
        minute, ends = self._minute
        if self.host_clock.monotonic() >= ends:
            minute, ends = self._minute = self._this_minute()
        key = (group, topic, minute)
        column = _DURATION_COLUMNS[bisect_left(DURATION_BUCKETS, duration)]
        counts = getattr(self._local, "counts", None) or self._new_counts()
        with counts.lock:
            rows = counts.rows
            row = rows.get(key) or _row(rows, key)
            row[outcome] += 1
            row[column] += 1
            row["duration_sum"] += duration
            if dead:
                row["dead_lettered"] += 1
            if attempt == 1:
                created = delivery.row.created_at
                _row(rows, (group, topic, created - created % MINUTE_MS))["published"] += 1

    def _this_minute(self) -> tuple[int, float]:
        """The current minute (database time) and when it ends on this host's monotonic
        clock."""
        now = self._estimate_ms()
        left = (MINUTE_MS - now % MINUTE_MS) / 1000
        return now - now % MINUTE_MS, self.host_clock.monotonic() + left

    def _new_counts(self) -> ThreadCounts:
        """This thread's rows, at its first run."""
        counts = self._local.counts = ThreadCounts()
        with self._threads_lock:
            self._threads.append(counts)
        return counts

    def _sum_up(self) -> None:
        """Move the handler threads' rows into the rows not yet written."""
        with self._threads_lock:
            threads = list(self._threads)
        for counts in threads:
            self._keep(counts.take())

    def _last_attempt(self, consumer: Consumer) -> int:
        key = (consumer.group, consumer.topic)
        if key not in self._max_attempts:  # any thread may fill it: the same value
            self._max_attempts[key] = consumer.options(self.conf).max_attempts
        return self._max_attempts[key]

    # -- the rest is the inner instruments' ----------------------------------------------------
    def polled(self, group: str, topic: str, delivered: int) -> None:
        self.inner.polled(group, topic, delivered)

    def batch(self, group: str, topic: str, size: int) -> None:
        self.inner.batch(group, topic, size)

    def statement(self) -> None:
        self.inner.statement()

    def leases_changed(self, group: str, topic: str, gained: int, lost: int) -> None:
        self.inner.leases_changed(group, topic, gained, lost)

    def reconnected(self) -> None:
        self.inner.reconnected()

    # -- writing, on the main thread ----------------------------------------------------------
    def next_due_ms(self) -> int | None:
        return self._next_ms

    def run_due(self) -> None:
        now = self._now_ms()
        if now >= self._next_ms:
            self._next_ms = now + self.interval_ms
            self.flush()

    def flush(self) -> bool:
        """Add what was counted since the last flush to the table (one transaction);
        on a database error keep it for the next flush. True when written."""
        self._sum_up()
        taken, self._pending = self._pending, {}
        if not taken:
            return True
        try:
            with transaction.atomic(using=self.alias), \
                    connections[self.alias].cursor() as cursor:
                storage.store(self.alias).add_minute_stats(cursor, taken)
        except AnyDatabaseError as exc:  # the consumer loop reconnects; add them next time
            logger.debug("Could not write the per-minute rollup: %s", exc)
            self._keep(taken)
            return False
        return True

    def _keep(self, taken: UnwrittenCounts) -> None:
        for key, columns in taken.items():
            row = self._pending.setdefault(key, dict(_EMPTY_ROW))
            for column, amount in columns.items():
                row[column] += amount


def collect_minute_stats(database: str, batch: int) -> tuple[int, bool]:
    """An extra collection of garbage collection (``register_collection``): the rows older than
    ``KEEP_MS``. ``batch`` is not needed: a pass finds a minute's rows at most."""
    with connections[database].cursor() as cursor:
        return storage.store(database).delete_minute_stats(cursor, KEEP_MS), False

