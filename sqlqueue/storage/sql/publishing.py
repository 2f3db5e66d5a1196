"""Publishing on a Django connection: the kept publishing cursor, inserting messages,
the offsets of their keys, idempotency keys, wake-up notifications, and the limits a
statement's size must keep. The statements are built once, in
``sqlqueue.storage.statements.publishing``; these methods run them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from threading import get_ident
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import IdempotencyDigest, MessageKey, MessageRow, VendorHooks
from sqlqueue.storage.statements.publishing import INSERT_COLUMNS, message_params


class PublishingAccess(VendorHooks):
    """Mixin for ``Store``: what publishing runs."""

    # -- the publishing cursor -----------------------------------------------------------
    _kept_cursor: CursorWrapper | None = None
    _kept_for: object | None = None  # the DB-API connection it was opened on
    _kept_by = 0  # the thread that opened it

    def publishing_cursor(self) -> CursorWrapper:
        """A cursor for ``insert_messages`` (and nothing else: on MySQL it runs only
        statements that answer no rows), opened once per DB-API connection and
        kept (a reconnect opens another); its users never close it. Opening and closing
        a cursor for each message was a sixth of a one-message publish's client CPU
        (``bench.publish_split``). What ``connection.cursor()`` does besides is kept: the
        health check (``CONN_HEALTH_CHECKS``) and the connect; ``execute_wrapper``s run
        on the kept cursor too. A cursor of its own for each use instead: while Django
        logs queries (``DEBUG``, ``assertNumQueries``), so that every statement is
        logged and counted; and in a thread other than the one that opened the kept
        cursor (a connection shared between threads, as a live-server test shares an
        in-memory SQLite database), whose INSERT must not read another thread's
        ``lastrowid``."""
        connection = self.connection
        connection.close_if_health_check_failed()
        if connection.queries_logged:
            return connection.cursor()
        cursor = self._kept_cursor
        if cursor is None or connection.connection is not self._kept_for:
            cursor = self._kept_cursor = self._new_publishing_cursor()
            self._kept_for, self._kept_by = connection.connection, get_ident()
        elif self._kept_by != get_ident():
            return connection.cursor()
        return cursor

    def _new_publishing_cursor(self) -> CursorWrapper:
        """The cursor ``publishing_cursor`` keeps: Django's, unless a vendor has a
        leaner one for statements that answer no rows."""
        return self.connection.cursor()

    #: the database can wake its listeners at commit (PostgreSQL ``NOTIFY``)
    notifies_wakeups = False

    def notify_wakeup(self, cursor: CursorWrapper, topic: str) -> None:
        """``notify_wakeup``: tell listening runners, when the current transaction commits,
        that ``topic`` has a new message. No statement where the database cannot."""

    def notify_heartbeat(self, cursor: CursorWrapper) -> None:
        """``notify_heartbeat``: a notification the listeners hear at once that wakes no
        topic (``sqlqueue.wakeups.listener``). No statement where the database cannot."""

    def select_idempotency_keys(
        self, cursor: CursorWrapper, digests: Sequence[IdempotencyDigest], *, lock: bool
    ) -> dict[IdempotencyDigest, int]:
        """``select_idempotency_keys`` (sqlqueue.storage.statements.publishing): which of
        ``digests`` were published within their window, with the offset of that first
        publish."""
        if not digests:
            return {}
        cursor.execute(*self.sql.select_idempotency_keys(sorted({h for h, _ in digests}),
                                                         lock=lock))
        wanted = set(digests)
        return {(int(h), int(lo)): int(o) for h, lo, o in cursor.fetchall()
                if (int(h), int(lo)) in wanted}

    def remember_idempotency_keys(
        self, cursor: CursorWrapper, keys: Sequence[tuple[int, int, int]], window_ms: int
    ) -> None:
        """``remember_idempotency_keys``: store (key_high, key_low, offset) of messages
        just published, until the database clock's now + ``window_ms``."""
        if keys:
            cursor.execute(*self.sql.remember_idempotency_keys(keys, window_ms))

    #: rows per publishing INSERT; also bounded by the driver's parameter limit
    max_rows_per_insert = 500
    _INSERT_COLUMNS = INSERT_COLUMNS

    def max_query_params(self) -> int:
        """The most parameters one statement may carry on this connection."""
        return self.connection.features.max_query_params or 65_535

    @staticmethod
    def insert_messages_params(rows: Sequence[MessageRow]) -> list[Any]:
        return message_params(rows)

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow], *, wake: str | None = None,
        prepared: bool = False,
    ) -> list[int] | None:
        """Insert ``rows``; return their offsets in order, or None if they cannot be known
        without reading them back. ``wake``: the rows' topic, to ``notify_wakeup`` for with
        them, where the database notifies (``notifies_wakeups``; PostgreSQL does it in
        the INSERT itself); elsewhere nothing. ``prepared``: a connection that publishes
        one message at a time often may run it as a statement prepared in its session
        (PostgreSQL: ``sqlqueue.storage.sql.prepared``); elsewhere nothing changes.

        Raises ``IntegrityError`` if any row's (topic, partition_key, id) exists; the
        statement is then rolled back as a whole and the transaction stays usable.
        """
        cursor.execute(*self.sql.store_messages(rows))
        return self.inserted_offsets(cursor, len(rows))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        """The offsets the last ``insert_messages`` of ``count`` rows allocated, if known."""
        raise NotImplementedError

    def select_message_offsets(
        self, cursor: CursorWrapper, topic: str, keys: Iterable[MessageKey], *, lock: bool
    ) -> dict[MessageKey, int]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        cursor.execute(*self.sql.select_message_offsets(topic, wanted, lock=lock))
        return {(pk, mid): int(offset) for offset, pk, mid in cursor.fetchall()}

    def max_statement_bytes(self) -> int:
        """Upper bound for one multi-row statement's size."""
        return 8 << 20

    def max_row_bytes(self) -> int | None:
        """The largest ``literal_bytes`` a row may have for its statement to reach the
        server (known after ``check_connection``); None: no such limit."""
        return None

    def literal_bytes(self, payload: bytes | str, metadata: str | None) -> int:
        """What a row's payload and metadata add to a statement (sent as parameters
        here: their own size)."""
        return len(payload) + len((metadata or "").encode("utf-8"))
