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
from typing import Any, Protocol

from django.db import DatabaseError, connections, transaction
from django.db import Error as AnyDatabaseError

from sqlqueue import events
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.consuming import handlers
from sqlqueue.consuming.clock import DatabaseClock
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.liveness import touch
from sqlqueue.consuming.pauses import Pause, PauseWatch
from sqlqueue.consuming.registry import Consumer, registered_consumers
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.consuming.wakeups import Wakeups
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.horizon import UNKNOWN, refresh_delay, settled_before
from sqlqueue.storage.sql import dialect_for
from sqlqueue.wakeups import Doorbell

logger = logging.getLogger("sqlqueue.consumer")

RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)  # seconds, after a lost connection
#: Adaptive polling: after a pass that saw new messages the next poll comes this soon,
#: then twice as late after each quiet one, up to POLL_INTERVAL. Messages arriving
#: steadily are picked up within milliseconds; an idle process still polls once per
#: POLL_INTERVAL (a handful of quick polls after the last message, then no more).
FIRST_QUICK_POLL = 0.002
#: Exit status of a process that stopped because a handler stayed stuck past its
#: consumer's timeout for the grace period (``exit_when_stuck``): its supervisor
#: replaces it at once (EX_TEMPFAIL).
EXIT_STUCK = 75


def lock_wait_seconds(conf: QueueSettings) -> int:
    """How long the main thread's statements wait for a row lock before giving up: a
    quarter of the renew interval (1 to 5 s), so that a peer paused while holding one
    (inside its cycle transaction) delays a lease tick or a cycle by that much at most,
    never past the renewal (the server's default is 50 s)."""
    return max(1, min(5, round(conf.LEASE_RENEW_INTERVAL / 4)))


class ServerChanged(Exception):
    """The connection reached another database server than before."""

    def __init__(self, before: str, now: str) -> None:
        super().__init__(f"the database server changed from {before!r} to {now!r}")
        self.before = before
        self.now = now


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


def _refuse_routed_elsewhere(consumers: Sequence[Consumer], conf: QueueSettings) -> None:
    """A consumer whose topic SQLQUEUE["ROUTES"] sends to another database would wait on
    an empty table here: say so instead."""
    elsewhere = sorted({(c.topic, conf.alias_for(c.topic)) for c in consumers
                        if conf.alias_for(c.topic) != conf.DATABASE})
    if elsewhere:
        listed = ", ".join(f"{topic} -> {alias}" for topic, alias in elsewhere)
        raise ConfigurationError(
            f"these topics are routed to another database than {conf.DATABASE!r} "
            f"(SQLQUEUE['ROUTES']): {listed}. Run 'runconsumer --database ALIAS' for each "
            "database, selecting its consumers with --group/--topic.")


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Timer(Protocol):
    """A periodic job the runner's main thread runs between passes; ``run_due`` must
    handle its own errors (a timer never stops the consumers)."""

    def run_due(self) -> object: ...

    def next_due_ms(self) -> int | None:
        """When ``run_due`` has work next, in the database clock's epoch milliseconds."""
        ...


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
        liveness_file: str | None = None,
        instruments: Instruments | None = None,
        exit_when_stuck: float | None = None,
    ) -> None:
        self.conf = conf or get_settings()
        # Under a supervisor: seconds a handler may stay stuck past its timeout before
        # this process stops (EXIT_STUCK) so that a fresh one takes its place.
        self.exit_when_stuck = exit_when_stuck
        self.exit_code = 0
        # Touched at each turn of the loop: a probe reads its age without a database.
        self.liveness_file = liveness_file
        self.instruments = instruments or Instruments()
        self.alias = self.conf.DATABASE
        _refuse_routed_elsewhere(consumers, self.conf)
        self.name = name or default_name()
        self.threads = threads or self.conf.THREADS
        self.until_empty = until_empty
        self.max_messages = max_messages
        self.clock = DatabaseClock(self._database_now)
        self.subscribers = [Subscriber(c, self.conf, self.alias, self.name,
                                       clock=self.clock.now_ms) for c in consumers]
        for subscriber in self.subscribers:
            subscriber.check_server = self._check_server
        self._server: str | None = None  # which database server this process talks to
        # Known to garbage collection: every group registered in this process for these
        # topics, running here or not, besides those with an offsets row anywhere.
        topics = {c.topic for c in consumers}
        known: dict[str, set[str]] = {topic: set() for topic in topics}
        for registered in (*registered_consumers(), *consumers):
            if registered.topic in topics:
                known[registered.topic].add(registered.group)
        self.collector = GarbageCollector(self.conf, self.alias, known)
        self.stopping = threading.Event()
        # Handler threads and stop() set it (a pass now); a publish rings it (a pass soon,
        # never sooner than FIRST_QUICK_POLL after the last: sqlqueue.wakeups.Doorbell).
        self._wakeup = Doorbell(FIRST_QUICK_POLL)
        self.wakeups: Wakeups | None = None
        self._work: queue.PriorityQueue[tuple[tuple[int, int], Delivery | None]] = (
            queue.PriorityQueue()
        )
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        # Outcomes taken from ``_done`` whose transaction did not commit (a lock wait gave
        # up, the connection dropped): recorded at the next pass, never dropped.
        self._unrecorded: list[Outcome] = []
        self._bounded_connection: object = None
        self._quiet_passes = 0  # passes in a row that saw no new message (adaptive polling)
        self._last_head = -1
        self._dispatched_before = 0
        self._in_flight = 0
        self._dispatched = 0
        self._signals = 0
        self._workers: list[threading.Thread] = []
        self._horizon_value: int | None = None
        self._horizon_expires = 0.0
        self.stats: Counter[str] = Counter()
        self.pauses = PauseWatch(self._read_pauses)
        self._timed_out = 0  # handler threads stuck past their consumer's timeout
        #: periodic jobs run on the main thread between passes (the schedules' ticker)
        self.timers: list[Timer] = []

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            self._install_signal_handlers()
        self.start_handler_threads()
        self.wakeups = Wakeups(self.conf, self.alias, {s.topic for s in self.subscribers},
                               self._wakeup.ring)
        logger.info("Subscriber %s started: %s, %s handler thread(s).", self.name,
                    ", ".join(s.consumer.name for s in self.subscribers), self.threads,
                    extra=events.fields(events.RUNNER_STARTED, subscriber=self.name,
                                        threads=self.threads,
                                        subscriptions=[s.consumer.name
                                                       for s in self.subscribers]))
        failures = 0
        try:
            while not self.stopping.is_set():
                if self.liveness_file:
                    touch(self.liveness_file)
                try:
                    delay = self._cycle()
                    failures = 0
                except ServerChanged as exc:
                    logger.warning("The database server changed from %r to %r (a failover, or "
                                   "a proxy that moved the connection): dropping every lease, "
                                   "every in-memory position and the outcomes of deliveries "
                                   "made on the old server; starting again from this "
                                   "server's watermarks.", exc.before, exc.now)
                    self._forget_server(exc.now)
                    continue
                except AnyDatabaseError as exc:
                    # Not only DatabaseError: a connection the server dropped raises
                    # InterfaceError, which Django does not derive from it.
                    backoff = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
                    failures += 1
                    self.instruments.reconnected()
                    logger.warning("Database error in the consumer loop (%s); reconnecting "
                                   "in %.1fs.", exc, backoff,
                                   extra=events.fields(events.RUNNER_RECONNECTING,
                                                       error=str(exc), delay=backoff))
                    self._reset_connection()
                    # Not on _wakeup: handlers finishing (or failing) during an outage
                    # would end the wait early and run through the backoff in a moment.
                    self.stopping.wait(backoff)
                    continue
                if delay is None:
                    break  # --until-empty: nothing left to do
                delay = self._run_timers(delay)
                self._wakeup.wait(delay)
                self._wakeup.clear()
        finally:
            self.wakeups.stop()
            self._shutdown()
        return self.exit_code

    @property
    def reached_max_messages(self) -> bool:
        return self.max_messages is not None and self._dispatched >= self.max_messages

    def _run_timers(self, delay: float) -> float:
        """Run the timers that are due; return ``delay`` shortened to the next one's time."""
        for timer in self.timers:
            timer.run_due()
            due = timer.next_due_ms()
            if due is not None:
                delay = min(delay, max(0.0, (due - self.clock.now_ms()) / 1000))
        return delay

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
    def run_once(self) -> float | None:
        """One pass of the loop, without its wait: what ``run`` does each time it wakes
        (for tests, and for embedding the runner in a loop of your own; call
        ``start_handler_threads`` first). Returns how long ``run`` would wait before the
        next pass, or None when an ``until_empty`` runner has nothing left to do."""
        return self._cycle()

    def _cycle(self) -> float | None:
        """One pass over every subscription; returns how long to wait before the next
        one (None: --until-empty found nothing left)."""
        connection = connections[self.alias]
        dialect = dialect_for(connection)
        with (connection.execute_wrapper(self._count_statement),
              connection.cursor() as cursor):
            self._bound_lock_waits(connection, cursor)
            self._check_pauses()
            self._enforce_timeouts()
            outcomes = self._collect_outcomes()
            # The log's head, read when first needed; the same statement says which server
            # answered.
            head = _Once(lambda: self._head(dialect, cursor))
            try:
                self._subscriptions(cursor, outcomes, head)
            finally:
                # Whatever stopped the pass, outcomes not yet written are kept (those of
                # deliveries made on another server are dropped when recorded).
                self._unrecorded += [o for rest in outcomes.values() for o in rest]
            self.collector.collect(cursor)
            return self._next_delay(head)

    def _subscriptions(self, cursor: Any, outcomes: dict[int, list[Outcome]],
                       head: Callable[[], int]) -> None:
        budget = None if self.max_messages is None else self.max_messages - self._dispatched
        for subscriber in self.subscribers:
            key = id(subscriber.consumer)
            if self.stopping.is_set():
                # A stop was asked for during this pass: record, take nothing new.
                self._record(subscriber, cursor, outcomes.pop(key, []))
                continue
            if self._paused(subscriber):
                self._hold_paused(subscriber, cursor, outcomes.pop(key, []), head)
                continue
            subscriber.discover(cursor, head)
            held = set(subscriber.leases.owned)
            self._taken_back(subscriber.keep_leases(cursor))
            if held != set(subscriber.leases.owned):
                now_held = set(subscriber.leases.owned)
                self.instruments.leases_changed(subscriber.group, subscriber.topic,
                                                len(now_held - held), len(held - now_held))
            if not subscriber.has_work(len(outcomes.get(key, ())), head):
                continue
            deliveries = self._pass(subscriber, cursor, outcomes.pop(key, []), head, budget)
            self.instruments.polled(subscriber.group, subscriber.topic, len(deliveries))
            # Handed to the handlers only once the marks are committed.
            subscriber.handed_out(deliveries)
            for delivery in deliveries:
                self._in_flight += 1
                self._dispatched += 1
                self._work.put((delivery.sort_key(), delivery))
            if budget is not None:
                budget -= len(deliveries)

    def _head(self, dialect: Any, cursor: Any) -> int:
        head, server = dialect.head_and_server(cursor)
        self._check_server(server)
        return int(head)

    def _check_server(self, server: str) -> None:
        """Raise ServerChanged if ``server`` is not the one this process talked to."""
        if self._server is None:
            self._server = server
        elif server != self._server:
            raise ServerChanged(self._server, server)

    def _forget_server(self, server: str) -> None:
        self._server = server
        self._horizon_value = None  # a horizon of the old server says nothing here
        self._horizon_expires = 0.0
        self.clock.invalidate()
        for subscriber in self.subscribers:
            subscriber.forget_server()

    def _pass(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome],
              head: Callable[[], int], budget: int | None) -> list[Delivery]:
        """One short transaction for one subscription: its leases are share-locked first,
        so every write below is made by the partitions' current owner. Returns the
        deliveries marked (committed). If a lock wait gives up, nothing of it happened:
        its outcomes are recorded at the next pass and its state is read again."""
        try:
            with transaction.atomic(using=self.alias):
                subscriber.fence(cursor)
                # The clock is read only now, after the fence's lock wait (however long):
                # every time this transaction stamps comes from after it (SPEC I4, I10).
                settled = self._settled_before(cursor, self.clock.now_ms())
                subscriber.record(cursor, outcomes)
                deliveries = subscriber.poll(cursor, head, budget)
                subscriber.advance(cursor, settled)
            subscriber.recorded(outcomes)
            return deliveries
        except AnyDatabaseError as exc:
            self._unrecorded += outcomes
            if not dialect_for(connections[self.alias]).is_lock_wait(exc):
                raise
            logger.warning("%s on %s/%s: gave up a lock wait (%s); trying again at the next "
                           "pass.", self.name, subscriber.group, subscriber.topic, exc)
            subscriber.reset()
            return []

    # -- pauses (queue pause / resume) --------------------------------------------------------
    def _read_pauses(self) -> list[Pause]:
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            return dialect_for(connection).list_pauses(cursor)

    def _check_pauses(self) -> None:
        """Read the pauses at most once a second (sqlqueue.consuming.pauses)."""
        if self.pauses.refresh():
            paused = [s.consumer.name for s in self.subscribers if self._paused(s)]
            logger.info("%s: paused subscriptions now: %s.", self.name,
                        ", ".join(paused) or "none")

    def _paused(self, subscriber: Subscriber) -> bool:
        return self.pauses.paused(subscriber.group, subscriber.topic)

    def _hold_paused(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome],
                     head: Callable[[], int]) -> None:
        """A paused subscription fetches nothing: it records what its running handlers
        did (and gives back what they did not start), and keeps its leases and heartbeat
        (taking its share of new partitions too), so that it resumes where it stopped
        and is not reported as STOP."""
        self._record(subscriber, cursor, outcomes)
        subscriber.discover(cursor, head)
        self._taken_back(subscriber.keep_leases(cursor))

    def _taken_back(self, deliveries: list[Delivery]) -> None:
        """Queued deliveries a subscriber took back (partitions handed over): no longer in
        flight; given back at the next pass with the outcomes (retried until written)."""
        self._in_flight -= len(deliveries)
        self._unrecorded += [Outcome(delivery, "not_started") for delivery in deliveries]

    # -- handler timeouts (@consumer(timeout=...)) ----------------------------------------
    def _enforce_timeouts(self) -> None:
        """A handler running past its consumer's ``timeout`` counts as failed now (retried
        with backoff). Its thread cannot be stopped: a new one takes its place, and it
        exits when the handler returns, its outcome dropped."""
        now = time.monotonic()
        for subscriber in self.subscribers:
            limit = subscriber.consumer.timeout
            if limit is None:
                continue
            for delivery in list(subscriber.outstanding.values()):
                if (delivery.started_at and now - delivery.started_at > limit
                        and delivery.time_out()):
                    logger.warning("%s/%s@%s: the handler of %s ran past its timeout (%gs); "
                                   "counted as failed.", subscriber.topic,
                                   delivery.partition_key, delivery.row.offset,
                                   subscriber.group, limit)
                    self._done.put(Outcome(delivery, "fail", error=(
                        f"TimeoutError: the handler ran past its timeout of {limit:g}s.")))
                    subscriber.stuck.append(delivery)
                    self._replace_handler_thread()
            self._exit_if_stuck(subscriber, limit, now)

    def _exit_if_stuck(self, subscriber: Subscriber, limit: float, now: float) -> None:
        """Under a supervisor, a handler thread stuck past its timeout for
        ``exit_when_stuck`` more seconds stops the process (a thread cannot be killed;
        a process can be replaced)."""
        subscriber.stuck = [d for d in subscriber.stuck if d.running]  # forget returned ones
        grace = self.exit_when_stuck
        if grace is None or self.stopping.is_set():
            return
        stuck = [d for d in subscriber.stuck if now - d.started_at > limit + grace]
        if stuck:
            logger.error("%s: %s handler(s) of %s stuck for more than %gs past their timeout; "
                         "stopping this process so that its supervisor replaces it.",
                         self.name, len(stuck), subscriber.consumer.name, grace)
            self.exit_code = EXIT_STUCK
            self.stop()

    def _replace_handler_thread(self) -> None:
        self._timed_out += 1
        worker = threading.Thread(target=self._handler_thread, daemon=True,
                                  name=f"sqlqueue-handler-{len(self._workers)}")
        worker.start()
        self._workers.append(worker)

    def _count_statement(self, execute: Callable[..., Any], sql: str, params: Any,
                         many: bool, context: Any) -> Any:
        self.instruments.statement()
        return execute(sql, params, many, context)

    def _bound_lock_waits(self, connection: Any, cursor: Any) -> None:
        """Once per database connection (a new one after a reconnect)."""
        if connection.connection is not self._bounded_connection:
            dialect_for(connection).bound_lock_waits(cursor, lock_wait_seconds(self.conf))
            self._bounded_connection = connection.connection

    def _collect_outcomes(self) -> dict[int, list[Outcome]]:
        """What the handler threads finished since the last pass (and what an earlier pass
        could not record), by consumer."""
        outcomes: dict[int, list[Outcome]] = {}
        for outcome in self._unrecorded:
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
        self._unrecorded = []
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return outcomes
            self._in_flight -= 1
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
            self.stats[outcome.kind] += 1

    def _record_outcomes(self, cursor: Any) -> None:
        outcomes = self._collect_outcomes()
        for subscriber in self.subscribers:
            self._record(subscriber, cursor, outcomes.get(id(subscriber.consumer), []))

    def _record(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome]) -> None:
        """Write outcomes as the partitions' owner (fenced), in one transaction."""
        if outcomes:
            try:
                with transaction.atomic(using=self.alias):
                    subscriber.fence(cursor)
                    subscriber.record(cursor, outcomes)
                subscriber.recorded(outcomes)
            except AnyDatabaseError:
                self._unrecorded += outcomes
                raise

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
        delay = self._polling_delay(head)
        dues = [d for d in (s.next_due_ms() for s in self.subscribers if not self._paused(s))
                if d is not None]
        if dues:
            delay = min(delay, max(0.0, (min(dues) - self.clock.now_ms()) / 1000))
        return delay

    def _polling_delay(self, head: Callable[[], int]) -> float:
        """FIRST_QUICK_POLL after a pass that saw new messages (the head moved, or work was
        handed out), doubling with every quiet pass up to POLL_INTERVAL."""
        seen = head.known() if isinstance(head, _Once) else None
        moved = seen is not None and seen != self._last_head
        if seen is not None:
            self._last_head = seen
        active = moved or self._dispatched != self._dispatched_before
        self._dispatched_before = self._dispatched
        self._quiet_passes = 0 if active else min(self._quiet_passes + 1, 30)
        return float(min(self.conf.POLL_INTERVAL, FIRST_QUICK_POLL * 2.0 ** self._quiet_passes))

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
            if (self.stopping.is_set() or self._paused_delivery(delivery)) and (
                delivery.give_back()
            ):
                # Stopping or paused: nothing new starts; the main thread gives it back.
                self._done.put(Outcome(delivery, "not_started"))
                self._wakeup.set()
                continue
            if not delivery.start():
                if delivery.refused:
                    # The partition's lease is no longer trusted: nothing starts, and
                    # the main thread gives the message back.
                    self._done.put(Outcome(delivery, "not_started"))
                    self._wakeup.set()
                continue
            started = time.time()
            try:
                outcome = handlers.run(delivery)
            finally:
                if connections[self.alias].in_atomic_block:  # a handler left one open
                    connections[self.alias].close()
            self._instrument(outcome, started)
            if not delivery.finish():
                return  # timed out: counted as failed already, and this thread replaced
            self._done.put(outcome)
            # Wake the main thread once half of what is in flight has finished (or at
            # its next poll): outcomes are then recorded in batches, not one by one.
            if 2 * self._done.qsize() >= self._in_flight:
                self._wakeup.set()

    def _paused_delivery(self, delivery: Delivery) -> bool:
        return self.pauses.paused(delivery.consumer.group, delivery.consumer.topic)

    def _instrument(self, outcome: Outcome, started: float) -> None:
        row, consumer = outcome.delivery.row, outcome.delivery.consumer
        due_ms = max(row.created_at, row.deliver_after)  # this host's clock vs the database's
        duration = time.time() - started
        self.instruments.handled(consumer.group, consumer.topic, outcome.kind, duration,
                                 max(0.0, started - due_ms / 1000))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s/%s@%s: %s after %.3fs (attempt %s).", consumer.topic,
                         outcome.delivery.partition_key, row.offset, outcome.kind, duration,
                         outcome.delivery.attempt,
                         extra=events.fields(events.MESSAGE_HANDLED, group=consumer.group,
                                             topic=consumer.topic,
                                             partition=outcome.delivery.partition_key,
                                             offset=row.offset,
                                             attempt=outcome.delivery.attempt,
                                             outcome=outcome.kind, duration=duration))

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
                    self._record_outcomes(cursor)
                self._record_outcomes(cursor)
                for subscriber in self.subscribers:
                    with transaction.atomic(using=self.alias):
                        subscriber.fence(cursor)
                        settled = self._settled_before(cursor, self.clock.now_ms())
                        subscriber.advance(cursor, settled, force=True)
                    subscriber.stop(cursor)  # hand the partitions over, deregister
        except (AnyDatabaseError, ServerChanged) as exc:
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
            worker.join(timeout=0 if self._in_flight > 0 or self._timed_out else 5)
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

