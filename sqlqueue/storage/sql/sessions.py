"""A session's settings on a Django connection: lock-wait and idle-transaction bounds,
poolers, Galera. The statements are built once, in
``sqlqueue.storage.statements.sessions``; these methods run them."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks
from sqlqueue.storage.statements.vendors import Statement


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
