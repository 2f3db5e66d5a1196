"""The database server the runner talks to: bounded lock waits, its identity (a failover,
or a proxy that moved the connection, is noticed at no extra statement), its clock, and
dropping the connection after a lost one. ``Runner`` owns one ``ServerWatch``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections

from sqlqueue import events, storage
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.takeover import record_first_server, void_old_server
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.storage.protocols import ServerStore

#: seconds between attempts after a lost connection, capped at 2 s: a failover (Patroni
#: promotes a replica in about 10 s) is noticed within 2 s of the new primary accepting
#: connections, where a 10 s cap cost up to 10 s more (wave-3 trial). An attempt is one
#: connection attempt: cheap for the server even from many runners.
RECONNECT_BACKOFF = (0.5, 1.0, 2.0)

logger = logging.getLogger("sqlqueue.consumer")


def lock_wait_seconds(conf: QueueSettings) -> int:
    """How long the main thread's statements wait for a row lock before giving up: a
    quarter of the renew interval (1 to 5 s), so that a peer paused while holding one
    (inside its cycle transaction) delays a lease tick or a cycle by that much at most,
    never past the renewal (the server's default is 50 s)."""
    return max(1, min(5, round(conf.LEASE_RENEW_INTERVAL / 4)))


def idle_transaction_ms(conf: QueueSettings) -> int:
    """How long a transaction of the runner's own session may sit idle (no statement
    running) before the server ends the session: ``LEASE_DURATION``. The runner's
    transactions run statement after statement in milliseconds; one idle that long is a
    runner frozen inside it (SIGSTOP, a VM pause, a log write blocked on a full pipe),
    whose share locks on its lease rows would otherwise keep every other runner from
    taking its partitions over for as long as it stays frozen. By then its leases have
    run out anyway (it stops trusting them sooner), so nothing it could still do as
    their owner is lost."""
    return max(1000, round(conf.LEASE_DURATION * 1000))


class ServerChanged(SqlqueueError):
    """The connection reached another database server than before."""

    def __init__(self, before: str, now: str) -> None:
        super().__init__(f"the database server changed from {before!r} to {now!r}")
        self.before = before
        self.now = now


class Head:
    """The log's head in one pass: read from the server on first use (the same statement
    says which server answered), then remembered. ``ServerWatch.head_of_pass`` makes one
    per pass; the parts below the runner call it, the Pacer reads ``known()``."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._value: int | None = None

    def __call__(self) -> int:
        if self._value is None:
            self._value = self._read()
        return self._value

    def known(self) -> int | None:
        """The head if this pass read it (without reading it)."""
        return self._value


class ServerWatch:
    """The server the runner's connection reaches, and that connection's session."""

    def __init__(self, *, conf: QueueSettings, alias: str, instruments: Instruments,
                 owns_session: bool = True, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.conf = conf
        self.alias = alias
        self.instruments = instruments
        #: False on a caller's connection (sqlqueue.testing): its session stays as it is
        self.owns_session = owns_session
        self.server: str | None = None  # which database server this process talks to
        self._bounded_connection: object = None
        #: the connection goes through a pooler: lock waits are bounded per transaction
        self._pooled = False
        #: the outermost atomic block whose transaction has its lock waits bounded (held,
        #: so that no later block can take its identity)
        self._bounded_block: object = None
        #: the server ends this session's transactions left idle (``idle_transaction_ms``)
        self.idle_transactions_bounded = False
        #: when the last statement started (monotonic), its transaction's outermost
        #: atomic block (None: autocommit), and the longest gap between two statement
        #: starts in that transaction (seconds)
        self._last_statement_at = 0.0
        self._last_block: object = None
        self._longest_gap = 0.0
        #: ``note_error`` found the session ended after this long idle (ms)
        self.idle_ended_ms: int | None = None

    def head(self, store: ServerStore, cursor: Any) -> int:
        """The log's head; the same statement says which server answered."""
        head, server = store.head_and_server(cursor)
        self.check(server)
        return int(head)

    def head_of_pass(self, store: Any, cursor: Any) -> Head:
        """The log's head for one pass, read when first needed (``Head``)."""
        return Head(lambda: self.head(store, cursor))

    def check(self, server: str) -> None:
        """Raise ServerChanged if ``server`` is not the one this process talked to."""
        if self.server is None:
            # Recorded before any lease is taken here (see sqlqueue.consuming.takeover).
            record_first_server(self.alias, server)
            self.server = server
        elif server != self.server:
            raise ServerChanged(self.server, server)

    def changed_to(self, server: str) -> None:
        """The connection reached ``server`` instead: what the old server granted
        (leases, deliveries in flight) is void there at once, if this runner is the first
        to notice (sqlqueue.consuming.takeover); the caller forgets what it knew."""
        before, self.server = self.server, server
        try:
            if before is not None:
                void_old_server(self.alias, before, server)
        except AnyDatabaseError as exc:
            logger.warning("Could not void the leases and deliveries of the old server "
                           "(%s): they run out instead (LEASE_DURATION, VISIBILITY_TIMEOUT).",
                           exc)

    def count_statement(self, execute: Callable[..., Any], sql: str, params: Any,
                         many: bool, context: Any) -> Any:
        """An execute wrapper on the runner's connection: counts its statements, notes
        when the last one started and in which transaction, and judges a failed one
        (``note_error``)."""
        self.instruments.statement()
        now = self.host_clock.monotonic()
        connection = context["connection"]
        block = connection.atomic_blocks[0] if connection.in_atomic_block else None
        if block is not None and block is self._last_block:
            # A freeze during the statement before (its answer waiting in the socket)
            # shows as a long gap between the two starts.
            self._longest_gap = max(self._longest_gap, now - self._last_statement_at)
        else:
            self._longest_gap = 0.0
        self._last_statement_at, self._last_block = now, block
        try:
            return execute(sql, params, many, context)
        except AnyDatabaseError:
            # Judged now: whoever catches this error may run statements before the
            # runner's loop sees one (a reconnect, outside the transaction).
            self.note_error()
            raise

    def note_error(self) -> None:
        """A transaction of the runner failed (a statement, or its commit): before any
        other statement runs (a reconnect's own included), judge whether it had sat idle
        past ``idle_transaction_ms`` since a statement started: the process was frozen
        or blocked inside it, and the server ended the session. A freeze shows as the
        time since the last statement started, or as the longest gap between two
        statement starts in that transaction (a freeze during the statement before,
        whose answer then waited in the socket)."""
        if not self.idle_transactions_bounded or self._last_block is None:
            return
        since = self.host_clock.monotonic() - self._last_statement_at
        idle_ms = round(max(self._longest_gap, since) * 1000)
        if idle_ms >= idle_transaction_ms(self.conf):
            self.idle_ended_ms = max(idle_ms, self.idle_ended_ms or 0)

    def ended_idle_transaction(self) -> int | None:
        """What ``note_error`` found (how long the transaction sat idle, in ms), once."""
        idle, self.idle_ended_ms = self.idle_ended_ms, None
        return idle

    def say_why_the_session_ended(self, name: str) -> None:
        """After an error in the runner ``name``'s loop: if ``note_error`` found its
        transaction idle past the server's bound (the runner was frozen or blocked inside
        it, and the server ended its session, releasing its lease rows), say so, once."""
        idle_ms = self.ended_idle_transaction()
        if idle_ms is None:
            return
        logger.warning(
            "%s: a transaction of this runner sat idle for %.1fs (the process was frozen or "
            "blocked, e.g. writing to a log nobody reads) and the database ended its "
            "session after %.1fs, releasing its lease rows to the other runners; "
            "reconnecting and taking leases again.", name, idle_ms / 1000,
            self.conf.LEASE_DURATION,
            extra=events.fields(events.RUNNER_SESSION_ENDED, subscriber=name,
                                idle_ms=idle_ms))

    def bound_lock_waits(self, connection: Any, cursor: Any) -> None:
        """Once per database connection (a new one after a reconnect): which server it
        reaches (``ServerChanged``); its lock waits bounded for the session,
        unless the connection goes through a pooler, whose sessions other clients get
        next; then in each transaction (``bound_transaction_lock_waits``)."""
        if not self.owns_session:
            return
        if connection.connection is not self._bounded_connection:
            store = storage.store(connection)
            # A new connection (the first, or after a lost one) may reach another server:
            # known before this cycle takes or writes anything (the head query's answer,
            # as at every poll).
            self.head(store, cursor)
            self._pooled = (store.bound_transaction_lock_waits(1) is not None
                            and store.through_pooler(cursor))
            if not self._pooled:
                store.bound_lock_waits(cursor, lock_wait_seconds(self.conf))
                # Server-enforced, on this session only (never a pooler's, never global).
                self.idle_transactions_bounded = store.bound_idle_transactions(
                    cursor, idle_transaction_ms(self.conf))
            self._bounded_connection = connection.connection

    def bound_transaction_lock_waits(self, execute: Callable[..., Any], sql: str,
                                      params: Any, many: bool, context: Any) -> Any:
        """An execute wrapper: behind a pooler, the first statement of each transaction
        is preceded by a ``SET LOCAL lock_timeout`` (autocommit statements run with the
        role's setting: see the topologies guide)."""
        connection = context["connection"]
        if self._pooled and connection.in_atomic_block:
            outermost = connection.atomic_blocks[0]
            if outermost is not self._bounded_block:
                statement = storage.store(connection).bound_transaction_lock_waits(
                    lock_wait_seconds(self.conf))
                assert statement is not None  # _pooled says so
                execute(*statement, False, context)
                self._bounded_block = outermost
        return execute(sql, params, many, context)

    def database_now(self) -> int:
        """The server's clock (epoch ms): what the runner's ``DatabaseClock`` reads."""
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            return storage.store(connection).database_now_ms(cursor)

    def drop_connection(self, name: str) -> None:
        """After a database error in the runner ``name``'s loop: the next pass opens a
        new connection (first, ``say_why_the_session_ended``)."""
        self.say_why_the_session_ended(name)
        with contextlib.suppress(AnyDatabaseError):
            connections[self.alias].close()
