"""The process loop behind ``manage.py runconsumer``.

One main thread talks to the database for every subscription (fetch, mark delivered,
record outcomes, move watermarks, collect garbage); ``threads`` handler threads run the
handlers. The runner owns its subscribers and one of each part: a ``HandlerPool`` (the
threads and what comes back from them), a ``Pacer`` (when the next pass comes), a
``ServerWatch`` (the server and the connection's session), a ``HorizonWatch``, a
``PauseWatch`` and a ``GarbageCollector``; here: the loop, one pass, and the exit.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections

from sqlqueue import events, storage
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, Clock, DatabaseClock, HostClock
from sqlqueue.consuming.exiting import EXIT_SETTLE_SECONDS, ExitSettler
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.handlers import Outcome
from sqlqueue.consuming.handoff import EXIT_STUCK, HandlerPool
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.liveness import touch
from sqlqueue.consuming.pacing import FIRST_QUICK_POLL, Pacer
from sqlqueue.consuming.pauses import PauseWatch, stored_pauses
from sqlqueue.consuming.registry import Consumer, groups_known_here, refuse_routed_elsewhere
from sqlqueue.consuming.server import RECONNECT_BACKOFF, Head, ServerChanged, ServerWatch
from sqlqueue.consuming.settling import HorizonWatch
from sqlqueue.consuming.signals import StopOnSignals
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.consuming.transactions import FencedTransactions
from sqlqueue.consuming.wakeups import Wakeups
from sqlqueue.wakeups import Doorbell

logger = logging.getLogger("sqlqueue.consumer")


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Runner:
    #: how long a graceful exit waits for the write horizon (``ExitSettler``)
    exit_settle_seconds = EXIT_SETTLE_SECONDS
    #: the runner opened its connection (sqlqueue.testing's runs on the caller's): its
    #: session settings are the runner's to set, and it closes it at the end
    owns_connection = True
    #: its parts' classes (sqlqueue.testing's: a pool without threads, no collection)
    pool_class: type[HandlerPool] = HandlerPool
    collector_class: type[GarbageCollector] = GarbageCollector

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
        host_clock: HostClock | None = None,
    ) -> None:
        self.conf = conf or get_settings()
        # This host's clocks, passed to every part that reads time (a test: a manual one).
        self.host_clock: HostClock = host_clock or SYSTEM_CLOCK
        # Under a supervisor: seconds a handler may stay stuck past its timeout before
        # this process stops (EXIT_STUCK) so that a fresh one takes its place.
        self.exit_when_stuck = exit_when_stuck
        self.exit_code = 0
        # Touched at each turn of the loop: a probe reads its age without a database.
        self.liveness_file = liveness_file
        self.instruments = instruments or Instruments()
        self.alias = self.conf.DATABASE
        refuse_routed_elsewhere(consumers, self.conf)
        self.name = name or default_name()
        self.threads = threads or self.conf.THREADS
        self.shutdown_timeout = float(self.conf.SHUTDOWN_TIMEOUT)  # 0 once told: at once
        self.until_empty = until_empty
        self.max_messages = max_messages
        self.server = ServerWatch(conf=self.conf, alias=self.alias,
                                  instruments=self.instruments,
                                  owns_session=self.owns_connection,
                                  host_clock=self.host_clock)
        # The database's time (guarantee I11); a test may pass one it moves itself.
        self.clock: Clock = clock or DatabaseClock(self.server.database_now,
                                                   host_clock=self.host_clock)
        self.subscribers = [Subscriber(c, self.conf, self.alias, self.name,
                                       clock=self.clock.now_ms,
                                       hold_clock=self.clock.estimate_ms,
                                       check_server=self.server.check,
                                       watch_when_idle=until_empty,
                                       host_clock=self.host_clock)
                            for c in consumers]
        self.collector = self.collector_class(self.conf, self.alias,
                                              groups_known_here(consumers),
                                              host_clock=self.host_clock)
        self.stopping = threading.Event()
        # Handler threads and stop() set it (a pass now); a publish rings it (a pass soon,
        # never sooner than FIRST_QUICK_POLL after the last: sqlqueue.wakeups.Doorbell).
        self.wakeup = Doorbell(FIRST_QUICK_POLL)
        self.wakeups: Wakeups | None = None
        self.on_signals = StopOnSignals(self.stop, self.conf.SHUTDOWN_TIMEOUT)
        self.pauses = PauseWatch(stored_pauses(self.alias), host_clock=self.host_clock)
        self.horizon = HorizonWatch(self.alias, self.conf.MAX_TRANSACTION_AGE,
                                    host_clock=self.host_clock)
        self.exit = ExitSettler(alias=self.alias, horizon=self.horizon, clock=self.clock,
                                settle_seconds=self.exit_settle_seconds,
                                host_clock=self.host_clock)
        self.pool = self.pool_class(
            name=self.name, threads=self.threads, alias=self.alias,
            instruments=self.instruments, stopping=self.stopping, wakeup=self.wakeup,
            paused=self.pauses.paused,
            exit_when_stuck=self.exit_when_stuck, on_stuck=self._stuck,
            host_clock=self.host_clock)
        self.transactions = FencedTransactions(alias=self.alias, name=self.name,
                                               server=self.server, horizon=self.horizon,
                                               clock=self.clock, pool=self.pool)
        self.pacer = Pacer(conf=self.conf, clock=self.clock, pool=self.pool,
                           subscribers=self.subscribers, pauses=self.pauses,
                           until_empty=until_empty, max_messages=max_messages)

    @property
    def stats(self) -> Counter[str]:
        """The outcomes its handlers returned, by kind (the HandlerPool counts them; each
        subscription's own counts are its ``Subscriber.stats``)."""
        return self.pool.stats

    def report_to(self, instruments: Instruments) -> None:
        """Count into ``instruments`` from now on (the minute rollup wraps the first)."""
        self.instruments = instruments
        self.pool.report_to(instruments)

    def _stuck(self) -> None:
        """A handler stuck past its timeout and grace: stop, for a supervisor to replace."""
        self.exit_code = EXIT_STUCK
        self.stop()

    def stop(self, *, at_once: bool = False) -> None:
        """Stop after the running handlers finish (up to SHUTDOWN_TIMEOUT), or ``at_once``
        (their messages come back after their visibility timeout)."""
        if at_once:
            self.shutdown_timeout = 0.0
        self.stopping.set()
        self.wakeup.set()

    def start_handler_threads(self) -> None:
        self.pool.start()

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            self.install_signal_handlers()
        self.start_handler_threads()
        self.wakeups = Wakeups(self.conf, self.alias, {s.consumer.topic for s in self.subscribers},
                               self.wakeup.ring)
        self.pacer.rely_on(self.wakeups.cover_other_processes)
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
                    touch(self.liveness_file, self.wakeups.deaf())
                dispatched = self.pool.dispatched
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
                    # Not only DatabaseError: Django's InterfaceError (a dropped connection).
                    backoff = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
                    failures += 1
                    self.instruments.reconnected()
                    logger.warning("Database error in the consumer loop (%s); reconnecting "
                                   "in %.1fs.", exc, backoff,
                                   extra=events.fields(events.RUNNER_RECONNECTING,
                                                       error=str(exc), delay=backoff))
                    self._reset_connection()
                    # Not on ``wakeup``: handlers ending in an outage would cut it short.
                    self.stopping.wait(backoff)
                    continue
                if delay is None:
                    break  # --until-empty: nothing left to do
                delay = self.pacer.run_timers(delay)
                filled_in = self.pool.next_filled_in()  # a batch held to fill is due
                if filled_in is not None:
                    delay = min(delay, filled_in)
                # Rings gather while delivering (min_gap); else the ringer goes at once.
                self.wakeup.wait(delay, coalesce=self.pool.dispatched != dispatched)
                self.wakeup.clear()
        finally:
            self.wakeups.stop()
            self.shutdown()
        return self.exit_code

    @property
    def reached_max_messages(self) -> bool:
        return self.max_messages is not None and self.pool.dispatched >= self.max_messages

    def install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM stop the runner gracefully (a second one at once); ``run``
        installs them unless told not to (a caller that installs them sooner)."""
        self.on_signals.install()

    # -- one pass ---------------------------------------------------------------------------
    def run_once(self) -> float | None:
        """One pass over every subscription, without its wait (for tests, and a loop of
        your own: ``start_handler_threads`` first, ``shutdown`` at the end): how long
        ``run`` would wait next, or None when an ``until_empty`` runner is done."""
        return self._cycle()

    def _cycle(self) -> float | None:
        connection = connections[self.alias]
        store = storage.store(connection)
        with (connection.execute_wrapper(self.server.count_statement),
              connection.execute_wrapper(self.server.bound_transaction_lock_waits),
              connection.cursor() as cursor):
            self.server.bound_lock_waits(connection, cursor)
            if self.wakeups is not None:  # autocommit: heard at once
                self.wakeups.keep_alive(lambda: store.notify_heartbeat(cursor))
            self._check_pauses()
            self.pool.enforce_timeouts([(s.consumer, s.deliveries) for s in self.subscribers])
            outcomes = self.pool.collect()
            # The log's head, read when first needed; the same statement says which server
            # answered.
            head = self.server.head_of_pass(store, cursor)
            try:
                self._subscriptions(cursor, outcomes, head)
            finally:
                # Whatever stopped the pass, outcomes not yet written are kept (those of
                # deliveries made on another server are dropped when recorded).
                self.pool.keep_unrecorded([o for rest in outcomes.values() for o in rest])
            self.pool.dispatch_filled()
            self.collector.collect(cursor)
            return self.pacer.next_delay(head)

    def _subscriptions(self, cursor: Any, outcomes: dict[int, list[Outcome]],
                       head: Head) -> None:
        budget = (None if self.max_messages is None
                  else self.max_messages - self.pool.dispatched)
        for subscriber in self.subscribers:
            key = id(subscriber.consumer)
            if self.stopping.is_set():
                # A stop was asked for during this pass: record, take nothing new.
                self.transactions.record(subscriber, cursor, outcomes.pop(key, []))
                continue
            if self._paused(subscriber):
                self._hold_paused(subscriber, cursor, outcomes.pop(key, []), head)
                continue
            subscriber.discover(cursor, head)
            change, taken = subscriber.keep_leases(cursor, head)
            self.pool.taken_back(taken)
            group, topic = subscriber.consumer.group, subscriber.consumer.topic
            if change:
                self.instruments.leases_changed(group, topic, len(change.gained),
                                                len(change.lost))
            if not subscriber.has_work(len(outcomes.get(key, ())), head):
                continue
            deliveries = self.transactions.deliver(subscriber, cursor, outcomes.pop(key, []),
                                                     head, budget)
            self.instruments.polled(group, topic, len(deliveries))
            # Handed to the handlers only once the marks are committed, each with the
            # server whose fence this pass passed (an atomic handler's ack goes there).
            for delivery in deliveries:
                delivery.server = self.server.server
            subscriber.handed_out(deliveries)
            self.pool.dispatch(deliveries)
            if budget is not None:
                budget -= len(deliveries)

    # -- pauses (queue pause / resume) --------------------------------------------------------
    def _check_pauses(self) -> None:
        """Read the pauses at most once a second (sqlqueue.consuming.pauses)."""
        if self.pauses.refresh():
            paused = [s.consumer.name for s in self.subscribers if self._paused(s)]
            logger.info("%s: paused subscriptions now: %s.", self.name,
                        ", ".join(paused) or "none")

    def _paused(self, subscriber: Subscriber) -> bool:
        return self.pauses.paused(subscriber.consumer.group, subscriber.consumer.topic)

    def _hold_paused(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome],
                     head: Head) -> None:
        """A paused subscription fetches nothing: it records what its running handlers did
        (gives back what they did not start), and keeps its leases, heartbeat and share of
        new partitions, to resume where it stopped and not be reported as STOP."""
        self.transactions.record(subscriber, cursor, outcomes)
        subscriber.discover(cursor, head)
        _, taken = subscriber.keep_leases(cursor)
        self.pool.taken_back(taken)

    def _record_outcomes(self, cursor: Any) -> None:
        outcomes = self.pool.collect()
        for subscriber in self.subscribers:
            self.transactions.record(subscriber, cursor, outcomes.get(id(subscriber.consumer), []))

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop fetching; give back what no handler started; let running handlers finish
        (up to SHUTDOWN_TIMEOUT); record their outcomes, move the watermarks over them,
        hand the partitions over; stop the threads. ``run`` ends with it."""
        self.pool.take_back_queued()  # given back with the first outcomes recorded below
        deadline = self.host_clock.monotonic() + self.shutdown_timeout
        try:
            connection = connections[self.alias]
            with (connection.execute_wrapper(self.server.bound_transaction_lock_waits),
                  connection.cursor() as cursor):
                while self.pool.in_flight > 0 and self.host_clock.monotonic() < deadline:
                    self.wakeup.wait(min(0.1, max(0.0, deadline - self.host_clock.monotonic())))
                    self.wakeup.clear()
                    self._record_outcomes(cursor)
                self._record_outcomes(cursor)
                self.exit.advance(cursor, self.subscribers, self.name)
                for subscriber in self.subscribers:
                    subscriber.stop(cursor)  # hand the partitions over, deregister
        except (AnyDatabaseError, ServerChanged) as exc:
            logger.warning("Could not record the last outcomes (%s); those messages will be "
                           "redelivered after their visibility timeout.", exc)
        if self.pool.in_flight > 0:
            logger.warning("%s handler(s) still running after %ss; their messages will be "
                           "redelivered after the visibility timeout.", self.pool.in_flight,
                           self.shutdown_timeout)
        self.pool.stop_threads()
        self._close_connection()

    def _close_connection(self) -> None:
        """Its own connection goes with it (sqlqueue.testing's, the caller's, stays open)."""
        if self.owns_connection:
            connections[self.alias].close()

    # -- the server -----------------------------------------------------------------------------
    def _forget_server(self, server: str) -> None:
        """The connection reached another server: nothing learnt on the old one holds."""
        self.server.changed_to(server)
        self.horizon.forget()
        self.clock.invalidate()
        for subscriber in self.subscribers:
            subscriber.forget_server()

    def _reset_connection(self) -> None:
        """After a database error: a new connection, and the in-memory view read again."""
        self.server.drop_connection(self.name)
        self.clock.invalidate()
        for subscriber in self.subscribers:
            subscriber.reset()

