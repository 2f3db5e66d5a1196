"""What every vendor's statements share; the vendor modules fill in the differences.

The statements live in mixins by subject (``delivery``, ``leases``, ``operating``,
``schedules``); the tables and row types in ``tables``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from threading import get_ident
from typing import Any, NamedTuple

from django.db import DatabaseError, IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.delivery import DeliveryAccess
from sqlqueue.storage.sql.leases import LeaseAccess
from sqlqueue.storage.sql.minute_stats import MinuteStatsAccess
from sqlqueue.storage.sql.operating import (
    DUES_PER_STATEMENT,
    PENDING_BRANCHES_PER_STATEMENT,
    OperatingAccess,
    PendingSummary,
)
from sqlqueue.storage.sql.schedules import ScheduleAccess
from sqlqueue.storage.sql.tables import (
    FetchedRow,
    IdempotencyDigest,
    MessageKey,
    MessageRow,
    OutcomeWrite,
    VendorHooks,
)
from sqlqueue.storage.statements import statements_for
from sqlqueue.storage.statements.publishing import INSERT_COLUMNS, message_params
from sqlqueue.storage.statements.tables import (
    FLOW_CONTROL_TABLE,
    GROUP_KEY,
    HEARTBEATS_TABLE,
    IDEMPOTENCY_TABLE,
    LEASES_TABLE,
    MESSAGE_TABLE,
    OFFSETS_TABLE,
    STATE_KEY,
    STATE_TABLE,
)
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


class ConsumingAccess(DeliveryAccess, LeaseAccess):
    """The subscriber's statements."""


#: a vendor's error for a missing sqlqueue table (``Dialect.is_missing_queue_table``)
MISSING_QUEUE_TABLE = re.compile(
    r"""(?:table|relation) ['"`]?(?:\w+\.)?queue_\w+['"`]? (?:doesn't|does not) exist"""
    r"|no such table: (?:\w+\.)?queue_\w+", re.IGNORECASE)


class Dialect(ConsumingAccess, OperatingAccess, ScheduleAccess, MinuteStatsAccess):
    """Named statements for one database vendor, bound to one connection."""

    vendor = ""
    #: SQL expression for the database clock in epoch milliseconds (one value per statement).
    now_ms_sql = ""
    #: appended to reads that must see the newest committed rows, not the snapshot
    locking_read_suffix = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.sql = statements_for(self.vendor)
        self.quote = connection.ops.quote_name

    def check_connection(self) -> None:
        """Refuse a connection that would store text wrongly, before anything is written
        through it (``ConfigurationError``). Nothing to check for most databases."""

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

    # -- wake-ups (sqlqueue.wakeups) ---------------------------------------------------
    #: the database can wake its listeners at commit (PostgreSQL ``NOTIFY``)
    notifies_wakeups = False

    def notify_wakeup(self, cursor: CursorWrapper, topic: str) -> None:
        """``notify_wakeup``: tell listening runners, when the current transaction commits,
        that ``topic`` has a new message. No statement where the database cannot."""

    def notify_heartbeat(self, cursor: CursorWrapper) -> None:
        """``notify_heartbeat``: a notification the listeners hear at once that wakes no
        topic (``sqlqueue.wakeups.listener``). No statement where the database cannot."""

    # -- idempotency keys (SPEC §9 "Idempotency window") -------------------------------
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

    def delete_expired_idempotency_keys(self, cursor: CursorWrapper, limit: int) -> int:
        """``delete_expired_idempotency_keys``: garbage-collect keys whose window has
        passed, at most ``limit`` per statement (idx_idempotency_expires)."""
        cursor.execute(*self.sql.delete_expired_idempotency_keys(limit))
        return int(cursor.rowcount)

    # -- insert_messages ---------------------------------------------------------------
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

    # -- select_message_offsets --------------------------------------------------------
    def select_message_offsets(
        self, cursor: CursorWrapper, topic: str, keys: Iterable[MessageKey], *, lock: bool
    ) -> dict[MessageKey, int]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        cursor.execute(*self.sql.select_message_offsets(topic, wanted, lock=lock))
        return {(pk, mid): int(offset) for offset, pk, mid in cursor.fetchall()}

    # -- database_now_ms ---------------------------------------------------------------
    def database_now_ms(self, cursor: CursorWrapper) -> int:
        """``database_now_ms``: the database clock, epoch milliseconds."""
        cursor.execute(*self.sql.database_now_ms())
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

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

    def is_galera(self, cursor: CursorWrapper) -> bool:
        """Is this server a node of a multi-writer cluster whose open transactions one
        node cannot see (Galera)?"""
        return False

    # -- lock waits --------------------------------------------------------------------
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

    def is_lock_wait(self, error: BaseException) -> bool:
        """Did ``error`` end a wait for a lock (timeout, or chosen as a deadlock victim)?
        The transaction can be rolled back and tried again."""
        return False

    # -- errors ------------------------------------------------------------------------
    def is_duplicate_message(self, error: IntegrityError) -> bool:
        """Did ``error`` come from ``idx_topic_partition_id`` (an idempotent-publish hit)?"""
        raise NotImplementedError

    @staticmethod
    def is_missing_queue_table(error: DatabaseError) -> bool:
        """Did ``error`` say that one of sqlqueue's tables does not exist (a database
        nobody migrated)? By its text, read without another statement: on PostgreSQL the
        failed statement has aborted the transaction. MySQL/MariaDB "Table 'x.queue_...'
        doesn't exist", PostgreSQL 'relation "queue_..." does not exist', SQLite "no such
        table: queue_..."."""
        first_line = str(error).split("\n", 1)[0]
        return MISSING_QUEUE_TABLE.search(first_line) is not None

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


__all__ = [
    "DUES_PER_STATEMENT",
    "FLOW_CONTROL_TABLE",
    "GROUP_KEY",
    "HEARTBEATS_TABLE",
    "IDEMPOTENCY_TABLE",
    "LEASES_TABLE",
    "MESSAGE_TABLE",
    "OFFSETS_TABLE",
    "PENDING_BRANCHES_PER_STATEMENT",
    "STATE_KEY",
    "STATE_TABLE",
    "ConsumingAccess",
    "DeliveryAccess",
    "Dialect",
    "FetchedRow",
    "IdempotencyDigest",
    "LeaseAccess",
    "MessageKey",
    "MessageRow",
    "OperatingAccess",
    "OutcomeWrite",
    "PendingSummary",
    "VendorHooks",
]
