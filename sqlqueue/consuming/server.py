"""The database server the runner talks to: bounded lock waits, its identity (a failover,
or a proxy that moved the connection, is noticed at no extra statement), its clock, and
starting again after a lost connection. A mixin of ``Runner``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import Clock
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.consuming.takeover import record_first_server, void_old_server
from sqlqueue.horizon import SettledCache
from sqlqueue.storage.sql import dialect_for

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


class ServerChanged(Exception):
    """The connection reached another database server than before."""

    def __init__(self, before: str, now: str) -> None:
        super().__init__(f"the database server changed from {before!r} to {now!r}")
        self.before = before
        self.now = now


class ServerWatch:
    """``Runner``'s server (it provides what is declared here)."""

    conf: QueueSettings
    alias: str
    clock: Clock
    subscribers: list[Subscriber]
    instruments: Instruments
    _horizon: SettledCache

    def __init__(self) -> None:
        self._server: str | None = None  # which database server this process talks to
        self._bounded_connection: object = None
        #: the connection goes through a pooler: lock waits are bounded per transaction
        self._pooled = False
        #: the outermost atomic block whose transaction has its lock waits bounded (held,
        #: so that no later block can take its identity)
        self._bounded_block: object = None

    def _head(self, dialect: Any, cursor: Any) -> int:
        head, server = dialect.head_and_server(cursor)
        self._check_server(server)
        return int(head)

    def _check_server(self, server: str) -> None:
        """Raise ServerChanged if ``server`` is not the one this process talked to."""
        if self._server is None:
            # Recorded before any lease is taken here (see sqlqueue.consuming.takeover).
            record_first_server(self.alias, server)
            self._server = server
        elif server != self._server:
            raise ServerChanged(self._server, server)

    def _forget_server(self, server: str) -> None:
        before, self._server = self._server, server
        try:
            if before is not None:
                void_old_server(self.alias, before, server)
        except AnyDatabaseError as exc:
            logger.warning("Could not void the leases and deliveries of the old server "
                           "(%s): they run out instead (LEASE_DURATION, VISIBILITY_TIMEOUT).",
                           exc)
        self._horizon.forget()  # a horizon of the old server says nothing here
        self.clock.invalidate()
        for subscriber in self.subscribers:
            subscriber.forget_server()

    def _count_statement(self, execute: Callable[..., Any], sql: str, params: Any,
                         many: bool, context: Any) -> Any:
        self.instruments.statement()
        return execute(sql, params, many, context)

    def _bound_lock_waits(self, connection: Any, cursor: Any) -> None:
        """Once per database connection (a new one after a reconnect): which server it
        reaches (``ServerChanged``); its lock waits bounded for the session,
        unless the connection goes through a pooler, whose sessions other clients get
        next; then in each transaction (``_bound_transaction_lock_waits``)."""
        if connection.connection is not self._bounded_connection:
            dialect = dialect_for(connection)
            # A new connection (the first, or after a lost one) may reach another server:
            # known before this cycle takes or writes anything (the head query's answer,
            # as at every poll).
            self._head(dialect, cursor)
            self._pooled = (dialect.bound_transaction_lock_waits(1) is not None
                            and dialect.through_pooler(cursor))
            if not self._pooled:
                dialect.bound_lock_waits(cursor, lock_wait_seconds(self.conf))
            self._bounded_connection = connection.connection

    def _bound_transaction_lock_waits(self, execute: Callable[..., Any], sql: str,
                                      params: Any, many: bool, context: Any) -> Any:
        """An execute wrapper: behind a pooler, the first statement of each transaction
        is preceded by a ``SET LOCAL lock_timeout`` (autocommit statements run with the
        role's setting: see the topologies guide)."""
        connection = context["connection"]
        if self._pooled and connection.in_atomic_block:
            outermost = connection.atomic_blocks[0]
            if outermost is not self._bounded_block:
                statement = dialect_for(connection).bound_transaction_lock_waits(
                    lock_wait_seconds(self.conf))
                assert statement is not None  # _pooled says so
                execute(*statement, False, context)
                self._bounded_block = outermost
        return execute(sql, params, many, context)

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

