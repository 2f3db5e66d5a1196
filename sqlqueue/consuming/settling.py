"""The write horizon a runner's passes use: database time before which no publishing
transaction is still open (sqlqueue.horizon), read through the runner's connection at
most every ``refresh_delay()`` seconds and shared by its subscriptions. ``Runner`` owns
one; each pass reads it right after its fence and hands it to the watermarks.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from sqlqueue import storage
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.horizon import UNKNOWN, SettledCache, settled_before


class HorizonWatch:
    """What the runner knows of the write horizon on its current server."""

    def __init__(self, alias: str, max_transaction_age: float, *,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.alias = alias
        self.max_transaction_age_ms = round(max_transaction_age * 1000)
        self._cache = SettledCache(monotonic=host_clock.monotonic)

    def settled_before(self, cursor: Any, now_ms: int) -> int | None:
        """Database time before which no publishing transaction is still open, so no row
        can still appear below a settled one (None: every visible row is settled). Read
        at most every ``refresh_delay()`` seconds; an older horizon is an earlier one,
        hence still safe.

        Call it right after the fence: its locking read has started the transaction, so a
        fresh INNODB_TRX snapshot lists this connection's own transaction; and no plain
        read has fixed the snapshot yet. Under REPEATABLE READ a horizon read after one
        could pass a writer that committed in between: no longer listed as open, yet
        invisible to this transaction's check of the window (guarantee I4). A horizon cached
        from an earlier transaction was read before this snapshot: safe too."""
        return self._cache.get(lambda previous: self._read(cursor, now_ms, previous))

    def expire(self) -> None:
        """Read it again at the next use (an exit waiting for it to pass its acks)."""
        self._cache.expire()

    def forget(self) -> None:
        """Another server answers now: a horizon of the old one says nothing here."""
        self._cache.forget()

    def _read(self, cursor: Any, now_ms: int, previous: int | None) -> int | None:
        try:
            seen = storage.store(self.alias).write_horizon(cursor)
        except DatabaseError:
            seen = UNKNOWN  # no view of open transactions: assume the longest allowed
        if seen is None:
            return None  # one writer at a time: nothing can commit out of order
        return settled_before(seen, now_ms, self.max_transaction_age_ms, previous)
