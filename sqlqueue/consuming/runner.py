"""The process loop behind ``manage.py runconsumer``.

One main thread talks to the database for every subscription (fetch, mark delivered,
record outcomes, move watermarks, collect garbage); ``threads`` handler threads run the
handlers. Work reaches the handlers through a priority queue (lower ``priority`` first)
and comes back through a completion queue that wakes the main thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db import Error as AnyDatabaseError

from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.consuming import handlers
from sqlqueue.consuming.clock import DatabaseClock
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.registry import Consumer, registered_consumers
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.horizon import UNKNOWN, refresh_delay, settled_before
from sqlqueue.storage.sql import dialect_for

logger = logging.getLogger("sqlqueue.consumer")

RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)  # seconds, after a lost connection


class _Once:
    """A value computed on first use, then remembered (the log's head, once a pass)."""

    def __init__(self, compute: Callable[[], int]) -> None:
        self._compute = compute
        self._value: int | None = None

    def __call__(self) -> int:
        if self._value is None:
            self._value = self._compute()
        return self._value


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Runner:
    def __init__(
        self,
        consumers: Sequence[Consumer],
        *,
        threads: int | None = None,
        name: str | None = None,
        until_empty: bool = False,
        max_messages: int | None = None,
        conf: QueueSettings | None = None,
    ) -> None:
        self.conf = conf or get_settings()
        self.alias = self.conf.DATABASE
        self.name = name or default_name()
        self.threads = threads or self.conf.THREADS
        self.until_empty = until_empty
        self.max_messages = max_messages
        self.subscribers = [Subscriber(c, self.conf, self.alias, self.name) for c in consumers]
        # Known to garbage collection: every group registered in this process for these
        # topics, running here or not, besides those with an offsets row anywhere.
        topics = {c.topic for c in consumers}
        known: dict[str, set[str]] = {topic: set() for topic in topics}
        for registered in (*registered_consumers(), *consumers):
            if registered.topic in topics:
                known[registered.topic].add(registered.group)
        self.collector = GarbageCollector(self.conf, self.alias, known)
        self.clock = DatabaseClock(self._database_now)
        self.stopping = threading.Event()
        self._wakeup = threading.Event()
        self._work: queue.PriorityQueue[tuple[tuple[int, int], Delivery | None]] = (
            queue.PriorityQueue()
        )
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._in_flight = 0
        self._dispatched = 0
        self._signals = 0
        self._workers: list[threading.Thread] = []
        self._horizon_value: int | None = None
        self._horizon_expires = 0.0
        self.stats: Counter[str] = Counter()

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            self._install_signal_handlers()
        self.start_handler_threads()
        logger.info("Subscriber %s started: %s, %s handler thread(s).", self.name,
                    ", ".join(s.consumer.name for s in self.subscribers), self.threads)
        failures = 0
        try:
            while not self.stopping.is_set():
                try:
                    delay = self._cycle()
                    failures = 0
                except AnyDatabaseError as exc:
                    # Not only DatabaseError: a connection the server dropped raises
                    # InterfaceError, which Django does not derive from it.
                    delay = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
                    failures += 1
                    logger.warning("Database error in the consumer loop (%s); reconnecting "
                                   "in %.1fs.", exc, delay)
                    self._reset_connection()
                if delay is None:
                    break  # --until-empty: nothing left to do
                self._wakeup.wait(delay)
                self._wakeup.clear()
        finally:
            self._shutdown()
        return 0

    def start_handler_threads(self) -> None:
        for n in range(self.threads):
            worker = threading.Thread(target=self._handler_thread, name=f"sqlqueue-handler-{n}",
                                      daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        self.stopping.set()
        self._wakeup.set()

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                logger.warning("Second signal: exiting at once.")
                os._exit(1)
            logger.warning("Signal %s: finishing in-flight handlers (up to %ss); signal "
                           "again to exit at once.", signum, self.conf.SHUTDOWN_TIMEOUT)
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    # -- one pass ---------------------------------------------------------------------------
    def _cycle(self) -> float | None:
        """One pass over every subscription; returns how long to wait before the next
        one (None: --until-empty found nothing left)."""
        connection = connections[self.alias]
        dialect = dialect_for(connection)
        with connection.cursor() as cursor:
            now_ms = self.clock.now_ms()
            outcomes = self._collect_outcomes()
            head = _Once(lambda: dialect.head_offset(cursor))  # read when first needed
            budget = None if self.max_messages is None else self.max_messages - self._dispatched
            for subscriber in self.subscribers:
                mine = outcomes.pop(id(subscriber.consumer), [])
                if self.stopping.is_set():
                    # A stop was asked for during this pass: record, take nothing new.
                    self._record(subscriber, cursor, mine, now_ms)
                    continue
                subscriber.discover(cursor, head)
                self._in_flight -= subscriber.keep_leases(cursor)
                if not subscriber.has_work(len(mine), head, now_ms):
                    continue
                # One short transaction per subscription: its leases are share-locked
                # first, so every write below is made by the partitions' current owner.
                with transaction.atomic(using=self.alias):
                    subscriber.fence(cursor)
                    settled = self._settled_before(cursor, now_ms)
                    subscriber.record(cursor, mine, now_ms)
                    deliveries = subscriber.poll(cursor, now_ms, head, budget)
                    subscriber.advance(cursor, settled)
                # Handed to the handlers only once the marks are committed.
                for delivery in deliveries:
                    self._in_flight += 1
                    self._dispatched += 1
                    self._work.put((delivery.sort_key(), delivery))
                if budget is not None:
                    budget -= len(deliveries)
            self.collector.collect(cursor)
            return self._next_delay(now_ms, head)

    def _collect_outcomes(self) -> dict[int, list[Outcome]]:
        """What the handler threads finished since the last pass, by consumer."""
        outcomes: dict[int, list[Outcome]] = {}
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return outcomes
            self._in_flight -= 1
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
            self.stats[outcome.kind] += 1

    def _record_outcomes(self, cursor: Any, now_ms: int) -> None:
        outcomes = self._collect_outcomes()
        for subscriber in self.subscribers:
            self._record(subscriber, cursor, outcomes.get(id(subscriber.consumer), []), now_ms)

    def _record(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome],
                now_ms: int) -> None:
        """Write outcomes as the partitions' owner (fenced), in one transaction."""
        if outcomes:
            with transaction.atomic(using=self.alias):
                subscriber.fence(cursor)
                subscriber.record(cursor, outcomes, now_ms)

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
        if time.monotonic() >= self._horizon_expires:
            self._horizon_value = self._read_horizon(cursor, now_ms)
            self._horizon_expires = time.monotonic() + refresh_delay()
        return self._horizon_value

    def _read_horizon(self, cursor: Any, now_ms: int) -> int | None:
        try:
            seen = dialect_for(connections[self.alias]).write_horizon(cursor)
        except DatabaseError:
            seen = UNKNOWN  # no view of open transactions: assume the longest allowed
        if seen is None:
            return None  # one writer at a time: nothing can commit out of order
        return settled_before(seen, now_ms, round(self.conf.MAX_TRANSACTION_AGE * 1000),
                              self._horizon_value)

    def _next_delay(self, now_ms: int, head: Callable[[], int]) -> float | None:
        if self.max_messages is not None and self._dispatched >= self.max_messages:
            if self._in_flight == 0:
                return None
        elif self.until_empty and self._in_flight == 0 and all(
            s.caught_up(head) and not s.busy(now_ms) for s in self.subscribers
        ):
            return None
        if not self._done.empty():
            return 0.0
        delay = self.conf.POLL_INTERVAL
        dues = [d for d in (s.next_due_ms() for s in self.subscribers) if d is not None]
        if dues:
            delay = min(delay, max(0.0, (min(dues) - now_ms) / 1000))
        return delay

    # -- handler threads ----------------------------------------------------------------------
    def _handler_thread(self) -> None:
        try:
            self._handle_until_told_to_stop()
        finally:
            connections.close_all()  # this thread's own connections

    def _handle_until_told_to_stop(self) -> None:
        while True:
            _, delivery = self._work.get()
            if delivery is None:
                return
            if self.stopping.is_set() and delivery.give_back():
                # Stopping: nothing new starts; the main thread gives it back.
                self._done.put(Outcome(delivery, "not_started"))
                self._wakeup.set()
                continue
            if not delivery.start():
                if not delivery.given_back:
                    # The partition's lease is no longer trusted: nothing starts, and
                    # the main thread gives the message back.
                    self._done.put(Outcome(delivery, "not_started"))
                    self._wakeup.set()
                continue
            try:
                outcome = handlers.run(delivery)
            finally:
                if connections[self.alias].in_atomic_block:  # a handler left one open
                    connections[self.alias].close()
            self._done.put(outcome)
            # Wake the main thread once half of what is in flight has finished (or at
            # its next poll): outcomes are then recorded in batches, not one by one.
            if 2 * self._done.qsize() >= self._in_flight:
                self._wakeup.set()

    # -- shutdown -------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop fetching; give back what no handler started; let running handlers finish
        (up to SHUTDOWN_TIMEOUT); record their outcomes; stop the threads."""
        given_back: list[Delivery] = []
        while True:
            try:
                _, delivery = self._work.get_nowait()
            except queue.Empty:
                break
            if delivery is not None and delivery.give_back():
                given_back.append(delivery)
                self._in_flight -= 1
        deadline = time.monotonic() + self.conf.SHUTDOWN_TIMEOUT
        try:
            connection = connections[self.alias]
            with connection.cursor() as cursor:
                for subscriber in self.subscribers:
                    mine = [d for d in given_back if d.consumer is subscriber.consumer]
                    if mine:
                        with transaction.atomic(using=self.alias):
                            subscriber.fence(cursor)
                            for delivery in mine:
                                if delivery.partition_key in subscriber.partitions:
                                    subscriber.give_back(cursor, delivery)
                while self._in_flight > 0 and time.monotonic() < deadline:
                    self._wakeup.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    self._wakeup.clear()
                    self._record_outcomes(cursor, self.clock.now_ms())
                self._record_outcomes(cursor, self.clock.now_ms())
                for subscriber in self.subscribers:
                    with transaction.atomic(using=self.alias):
                        subscriber.fence(cursor)
                        settled = self._settled_before(cursor, self.clock.now_ms())
                        subscriber.advance(cursor, settled, force=True)
                    subscriber.stop(cursor)  # hand the partitions over, deregister
        except AnyDatabaseError as exc:
            logger.warning("Could not record the last outcomes (%s); those messages will be "
                           "redelivered after their visibility timeout.", exc)
        if self._in_flight > 0:
            logger.warning("%s handler(s) still running after %ss; their messages will be "
                           "redelivered after the visibility timeout.", self._in_flight,
                           self.conf.SHUTDOWN_TIMEOUT)
        for n, _ in enumerate(self._workers):
            self._work.put(((1 << 30, n), None))  # after any real work; keys never tie
        for worker in self._workers:
            # Threads still stuck in a handler past SHUTDOWN_TIMEOUT are daemons: the
            # process may exit without them.
            worker.join(timeout=0 if self._in_flight > 0 else 5)
        for subscriber in self.subscribers:
            self.stats.update({f"{subscriber.consumer.name}:{k}": v
                               for k, v in subscriber.stats.items()})
        connections[self.alias].close()

    def _database_now(self) -> int:
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            return dialect_for(connection).database_now_ms(cursor)

    def _reset_connection(self) -> None:
        with contextlib.suppress(AnyDatabaseError):
            connections[self.alias].close()
        self.clock.invalidate()
        for subscriber in self.subscribers:
            subscriber.reset()

