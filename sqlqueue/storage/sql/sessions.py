"""A session's settings on a Django connection: lock-wait and idle-transaction bounds,
poolers, Galera. The statements are built once, in
``sqlqueue.storage.statements.sessions``; these methods run them."""

from __future__ import annotations

from typing import NamedTuple

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks
from sqlqueue.storage.statements.vendors import Statement


class OpenWriter(NamedTuple):
    """An open transaction of another session that has written (``oldest_writer``)."""

    session: str  # PostgreSQL's pid, MariaDB's connection id
    database: str
    started_ms: int  # epoch ms, the server's clock
    query_started_ms: int | None  # its current or last statement's start (PostgreSQL)
    state: str  # "idle in transaction", "active" (PostgreSQL); "RUNNING", "LOCK WAIT"
    query: str  # its current statement (MariaDB), or its last one (PostgreSQL)
    open_ms: int  # how long it has been open

    def describe(self) -> str:
        text = " ".join(self.query.split())
        return (f"session {self.session}"
                + (f" on database {self.database!r}" if self.database else "")
                + f", open for {self.open_ms / 1000:.1f}s (since epoch ms {self.started_ms}),"
                f" {self.state or 'state unknown'}"
                + (f", its statement begun at epoch ms {self.query_started_ms}"
                   if self.query_started_ms is not None else "")
                + (f": {text[:200]!r}" if text else ""))


class SessionAccess(VendorHooks):
    """Mixin for ``Store``: the session's bounds and what the session reaches."""

    def is_galera(self, cursor: CursorWrapper) -> bool:
        """Is this server a node of a multi-writer cluster whose open transactions one
        node cannot see (Galera)?"""
        return False

    def bound_lock_waits(self, cursor: CursorWrapper, seconds: int) -> None:
        """``bound_lock_waits``: give up a row-lock wait of this session after
        ``seconds`` (an error ``is_lock_wait`` recognises) instead of the server's
        default. Nothing to do where the connection's own busy timeout applies. Called
        outside a transaction, so no rollback undoes it."""
        statement = self.sql.bound_lock_waits(seconds)
        if statement is not None:
            cursor.execute(*statement)

    def bound_idle_transactions(self, cursor: CursorWrapper, milliseconds: int) -> bool:
        """``bound_idle_transactions``: the server ends this session once one of its
        transactions stays idle for ``milliseconds``. Returns whether the server does so
        (False: the vendor, or this server, has no such setting). Called outside a
        transaction, on a session of the runner's own, never on one shared through a
        pooler."""
        statement = self.sql.bound_idle_transactions(milliseconds)
        if statement is None:
            return False
        cursor.execute(*statement)
        return True

    def bound_transaction_lock_waits(self, seconds: int) -> Statement | None:
        """``bound_transaction_lock_waits``: the statement that bounds the lock waits of
        the current transaction only (None: ``bound_lock_waits`` is the vendor's way)."""
        return self.sql.bound_transaction_lock_waits(seconds)

    def through_pooler(self, cursor: CursorWrapper) -> bool:
        """Does this connection reach its server session through a connection pooler
        (whose next transaction may run on another session)? Never for most vendors."""
        return False

    def oldest_writer(self, cursor: CursorWrapper) -> OpenWriter | None:
        """``oldest_writer``: the other session's open write transaction that began
        first (what holds the write horizon back), or None (none, or a vendor with one
        writer at a time). Outside a transaction: the view is the server's now."""
        statement = self.sql.oldest_writer()
        if statement is None:
            return None
        cursor.execute(*statement)
        row = cursor.fetchone()
        if row is None:
            return None
        session, database, started, query_started, state, query, open_ms = row
        return OpenWriter(str(session), database or "", int(started),
                          None if query_started is None else int(query_started),
                          str(state or ""), str(query or ""), int(open_ms))
