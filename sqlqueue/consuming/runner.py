"""The process loop behind ``manage.py runconsumer``.

One main thread talks to the database for every subscription (fetch, mark delivered,
record outcomes, move watermarks, collect garbage); ``threads`` handler threads run the
handlers (sqlqueue.consuming.handoff). Its timing is in ``pacing``, what it knows of the
database server in ``server``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections, transaction

from sqlqueue import events
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.consuming.clock import Clock, DatabaseClock
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.handoff import HandOff
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.liveness import touch
from sqlqueue.consuming.pacing import FIRST_QUICK_POLL, Pacing, Timer, _Once
from sqlqueue.consuming.pauses import Pause, PauseWatch
from sqlqueue.consuming.registry import Consumer, registered_consumers
from sqlqueue.consuming.server import RECONNECT_BACKOFF, ServerChanged, ServerWatch
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.consuming.wakeups import Wakeups
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.storage.sql import dialect_for
from sqlqueue.wakeups import Doorbell

logger = logging.getLogger("sqlqueue.consumer")


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


#: At a graceful exit, how long the runner waits for the write horizon to pass the rows
#: it acked last (MySQL's lags the clock by up to two seconds, in whole seconds), and how
#: often it looks.
EXIT_SETTLE_SECONDS = 3.0
EXIT_SETTLE_STEP = 0.5


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Runner(HandOff, Pacing, ServerWatch):
    #: how long a graceful exit waits for the write horizon (``_advance_before_exit``)
    exit_settle_seconds = EXIT_SETTLE_SECONDS

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
        clock: Clock | None = None,
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
        # The database's time (SPEC I11); a test may pass one it moves itself.
        self.clock: Clock = clock or DatabaseClock(self._database_now)
        self.subscribers = [Subscriber(c, self.conf, self.alias, self.name,
                                       clock=self.clock.now_ms,
                                       hold_clock=self.clock.estimate_ms)
                            for c in consumers]
        for subscriber in self.subscribers:
            subscriber.check_server = self._check_server
            subscriber.watch_when_idle = until_empty
        HandOff.__init__(self)
        Pacing.__init__(self)
        ServerWatch.__init__(self)
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
        self._signals = 0
        self.stats: Counter[str] = Counter()
        self.pauses = PauseWatch(self._read_pauses)
        #: periodic jobs run on the main thread between passes (the schedules' ticker)
        self.timers: list[Timer] = []

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            self.install_signal_handlers()
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

    def install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM stop the runner gracefully (a second one at once); ``run``
        installs them unless told not to (a caller that installs them sooner)."""
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
              connection.execute_wrapper(self._bound_transaction_lock_waits),
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
            # Handed to the handlers only once the marks are committed, each with the
            # server whose fence this pass passed (an atomic handler's ack goes there).
            for delivery in deliveries:
                delivery.server = self._server
            subscriber.handed_out(deliveries)
            self._dispatch(deliveries)
            if budget is not None:
                budget -= len(deliveries)

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

    # -- shutdown -------------------------------------------------------------------------------
    def _advance_before_exit(self, cursor: Any) -> None:
        """Move every watermark over what this process acked before it hands its
        partitions over (SPEC §10 "Exit with positions"). Rows inserted in the last
        moments are not settled yet where the write horizon trails the clock (MySQL's
        INNODB_TRX: a second or two): the horizon is read again until it passes them,
        for up to EXIT_SETTLE_SECONDS. Where it cannot (a publisher's transaction still
        open, or no view of open transactions: MAX_TRANSACTION_AGE), the rest is left
        for the partitions' next holder, as the late-commit rule requires (SPEC I4)."""
        deadline = time.monotonic() + self.exit_settle_seconds
        waiting = list(self.subscribers)
        while True:
            for subscriber in waiting:
                with transaction.atomic(using=self.alias):
                    subscriber.fence(cursor)
                    settled = self._settled_before(cursor, self.clock.now_ms())
                    subscriber.advance(cursor, settled, force=True)
            waiting = [s for s in waiting if s.done_above_watermarks()]
            if not waiting or time.monotonic() >= deadline:
                break
            self._horizon.expire()
            time.sleep(EXIT_SETTLE_STEP)
        if waiting:
            logger.info("%s: exiting with acks above the watermark of %s (their rows are not "
                        "settled yet: a publishing transaction may still be open); the "
                        "partitions' next holder moves it over them.", self.name,
                        ", ".join(s.consumer.name for s in waiting))

    def _shutdown(self) -> None:
        """Stop fetching; give back what no handler started; let running handlers finish
        (up to SHUTDOWN_TIMEOUT); record their outcomes; stop the threads."""
        self._take_back_queued()  # given back with the first outcomes recorded below
        deadline = time.monotonic() + self.conf.SHUTDOWN_TIMEOUT
        try:
            connection = connections[self.alias]
            with (connection.execute_wrapper(self._bound_transaction_lock_waits),
                  connection.cursor() as cursor):
                while self._in_flight > 0 and time.monotonic() < deadline:
                    self._wakeup.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    self._wakeup.clear()
                    self._record_outcomes(cursor)
                self._record_outcomes(cursor)
                self._advance_before_exit(cursor)
                for subscriber in self.subscribers:
                    subscriber.stop(cursor)  # hand the partitions over, deregister
        except (AnyDatabaseError, ServerChanged) as exc:
            logger.warning("Could not record the last outcomes (%s); those messages will be "
                           "redelivered after their visibility timeout.", exc)
        if self._in_flight > 0:
            logger.warning("%s handler(s) still running after %ss; their messages will be "
                           "redelivered after the visibility timeout.", self._in_flight,
                           self.conf.SHUTDOWN_TIMEOUT)
        self._stop_handler_threads()
        for subscriber in self.subscribers:
            self.stats.update({f"{subscriber.consumer.name}:{k}": v
                               for k, v in subscriber.stats.items()})
        self._close_connection()

    def _close_connection(self) -> None:
        """The runner's own connection goes with it (sqlqueue.testing's runner, on the
        caller's connection, keeps it open)."""
        connections[self.alias].close()

