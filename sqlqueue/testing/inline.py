"""``run_consumers``' runner: ``runconsumer``'s ``Runner``, with its handlers run in this
thread, on this thread's connection, inside the caller's transaction.

A ``django.test.TestCase`` holds every row it wrote in one uncommitted transaction: a
handler on another thread (another connection) would wait on its locks, or not see its
rows. So nothing here starts a thread or opens a connection: each pass of the runner
(fetch, mark delivered, record outcomes: the code ``runconsumer`` runs, in savepoints of
the caller's transaction) is followed by the handlers of what it handed out, each in a
savepoint of its own, and the next pass records their outcomes. The run ends when nothing
is deliverable now: read to the end of the log, nothing due, nothing in flight. A retry
waiting on its backoff, or a message scheduled for later, ends it too (``advance_clock``
makes them due).
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming import batches, handlers
from sqlqueue.consuming.batches import Batch
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.handlers import Outcome
from sqlqueue.consuming.handoff import HandlerPool
from sqlqueue.consuming.registry import Consumer
from sqlqueue.consuming.runner import Runner, default_name
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.testing.clock import moved_database_clock
from sqlqueue.testing.failures import HandlerFailure

#: A run that has not settled after this long is waiting on something no test controls
#: (partitions leased by a real ``runconsumer``, a consumer's rate limit), or never ends
#: (handlers publishing for each other): it stops with an error rather than hanging the
#: test suite.
SETTLE_TIMEOUT = 30.0

_runs = itertools.count(1)


class _NoCollection(GarbageCollector):
    """Garbage collection is not run inside a test: acked messages and task results stay
    readable to the test's assertions."""

    def collect(self, cursor: Any, force: bool = False) -> int:
        return 0


class InlinePool(HandlerPool):
    """A handler pool without threads: ``run_handed_out`` runs the handlers of what was
    handed out on the calling thread, and keeps what each failing one raised."""

    #: stop at the first handler that raises (``run_consumers(raise_errors=True)``): what
    #: is still handed out is not started (the runner's shutdown gives it back)
    stop_at_first_failure = False

    def __init__(self, **parts: Any) -> None:
        super().__init__(**parts)
        self.failures: list[HandlerFailure] = []

    def start(self) -> None:
        """No threads."""

    def run_handed_out(self) -> int:
        """Run the handlers of every delivery the last pass handed out, best first (the
        handler threads' order); their outcomes wait for the next pass."""
        ran = 0
        if self.filling.held:  # no max_wait in a test: what is deliverable now
            self._queue_batches(self.filling.due(everything=True))
        while not (self.stop_at_first_failure and self.failures):
            try:
                _, delivery = self.work.get_nowait()
            except queue.Empty:
                return ran
            if delivery is None:
                continue
            if isinstance(delivery, Batch):
                ran += self._run_batch_here(delivery)
                continue
            if not delivery.start():
                if delivery.refused:  # the partition's lease is no longer trusted
                    self.done.put(Outcome(delivery, "not_started"))
                continue
            delivery.own_connection = False  # extend_visibility() writes on this one
            try:
                outcome = _handle_in_savepoint(delivery)
            except BaseException:
                # KeyboardInterrupt (handlers.handle turns everything else, SystemExit
                # included, into an outcome): no outcome will come back for the shutdown
                # to wait for.
                self.lost()
                raise
            delivery.finish()
            self.done.put(outcome)
            ran += 1
            if outcome.exception is not None:
                self.failures.append(HandlerFailure.of(outcome))
        return ran

    def _run_batch_here(self, batch: Batch) -> int:
        """A batch consumer's call, in a savepoint as a single handler's; returns how many
        deliveries it ran."""
        started, refused = batches.start_all(batch.deliveries,
                                             batch.deliveries[0].consumer.ordered)
        for delivery in refused:
            self.done.put(Outcome(delivery, "not_started"))
        if not started:
            return 0
        for delivery in started:
            delivery.own_connection = False
        try:
            outcomes = _in_savepoint(started[0].alias, lambda: batches.run_batch(started))
        except BaseException:
            for _ in started:  # KeyboardInterrupt: no outcome will come back
                self.lost()
            raise
        consumer = started[0].consumer
        self.instruments.batch(consumer.group, consumer.topic, len(started))
        reported: set[int] = set()  # one failure per exception raised, not per message
        for outcome in outcomes:
            outcome.delivery.finish()
            self.done.put(outcome)
            if outcome.exception is not None and id(outcome.exception) not in reported:
                reported.add(id(outcome.exception))
                self.failures.append(HandlerFailure.of(outcome))
        return len(started)


def _in_savepoint(alias: str, run: Callable[[], list[Outcome]]) -> list[Outcome]:
    """As ``_handle_in_savepoint``, for a batch call."""
    if not connections[alias].in_atomic_block:
        return run()
    with transaction.atomic(using=alias):
        return run()


def _handle_in_savepoint(delivery: handlers.Delivery) -> Outcome:
    """One handler call; inside the caller's transaction, in a savepoint of it: a
    database error in the handler rolls back to it (``handlers`` marks it), and the
    caller's transaction stays usable. A handler that raises anything else keeps its
    writes, as it would under ``runconsumer`` (where they committed as it went).
    Outside a transaction (a ``TransactionTestCase``) it runs as under ``runconsumer``:
    its writes commit as it goes (on SQLite a transaction around it would hold the write
    lock that its writes through another alias wait for)."""
    if not connections[delivery.alias].in_atomic_block:
        return handlers.handle(delivery)
    with transaction.atomic(using=delivery.alias):
        return handlers.handle(delivery)


class InlineRunner(Runner):
    # Inside a TestCase the test's own transaction holds the write horizon back: waiting
    # at the end for it to pass the rows acked last would only cost seconds.
    exit_settle_seconds = 0.0
    # The connection is the caller's (and holds the test's transaction): its session
    # settings stay as they are, and it stays open.
    owns_connection = False
    pool_class = InlinePool
    collector_class = _NoCollection
    pool: InlinePool

    def __init__(self, consumers: Sequence[Consumer], conf: QueueSettings,
                 max_messages: int | None = None, stop_at_first_failure: bool = False) -> None:
        super().__init__(consumers, conf=conf, threads=1, until_empty=True,
                         max_messages=max_messages,
                         name=f"{default_name()}-test-{next(_runs)}",
                         clock=moved_database_clock(conf.DATABASE))
        self.pool.stop_at_first_failure = stop_at_first_failure

    @property
    def failures(self) -> list[HandlerFailure]:
        """The handler calls that raised, in the order they ran."""
        return self.pool.failures

    @property
    def stopped_by_failure(self) -> bool:
        return self.pool.stop_at_first_failure and bool(self.pool.failures)

    @property
    def handled(self) -> int:
        """Deliveries handed to a handler so far."""
        return self.pool.dispatched

    # -- the run --------------------------------------------------------------------------
    def run_here(self) -> None:
        """Pass, run what was handed out, pass again (recording it), until settled; then
        record the last outcomes, move the watermarks and release the leases, as a
        ``runconsumer`` that exits does."""
        deadline = self.host_clock.monotonic() + SETTLE_TIMEOUT
        try:
            while True:
                if self.host_clock.monotonic() > deadline:
                    raise SqlqueueError(self._not_settled())
                delay = self.run_once()
                if self.pool.run_handed_out():
                    if self.stopped_by_failure:
                        # Record what ran (a stopping pass takes nothing new); the
                        # shutdown gives back what was handed out and not started.
                        self.stop()
                        self.run_once()
                        return
                    # The handlers may have published to partitions not seen yet.
                    for subscriber in self.subscribers:
                        subscriber.finder.look_again_now()
                    continue  # the next pass records their outcomes
                if self._has_outcomes():
                    continue
                if delay is None or self.reached_max_messages or self._settled():
                    return
                self.wakeup.wait(delay)
                self.wakeup.clear()
        finally:
            self.shutdown()

    def _has_outcomes(self) -> bool:
        return self.pool.in_flight > 0 or self.pool.has_outcomes()

    def _settled(self) -> bool:
        """Nothing deliverable now: every (unpaused) subscription has read its partitions
        to the log's head, and none has a message due."""
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            head = self.server.head(storage.store(connection), cursor)
        now_ms = self.clock.now_ms()
        for subscriber in self.subscribers:
            if self._paused(subscriber):
                continue
            if not subscriber.caught_up(lambda: head):
                return False
            batch, ordered = subscriber.options.batch_size, subscriber.consumer.ordered
            if any(state.ready(now_ms, batch, ordered)
                   for key, state in subscriber.partitions.items()
                   if subscriber.leases.holds(key)):
                return False
        return True

    def _not_settled(self) -> str:
        names = ", ".join(s.consumer.name for s in self.subscribers)
        return (f"run_consumers() did not settle within {SETTLE_TIMEOUT:g}s ({names}): "
                "their partitions may be leased by a running 'manage.py runconsumer', a "
                "consumer's rate_limit may hold the messages back, or handlers keep "
                "publishing messages for each other.")
