"""What every vendor's statements share; the vendor modules fill in the differences.

The statements live in mixins by subject (``delivery``, ``leases``, ``operating``,
``schedules``); the tables and row types in ``tables``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.delivery import DeliveryStatements
from sqlqueue.storage.sql.leases import LeaseStatements
from sqlqueue.storage.sql.operating import (
    DUES_PER_STATEMENT,
    PENDING_BRANCHES_PER_STATEMENT,
    OperatingStatements,
    PendingSummary,
)
from sqlqueue.storage.sql.schedules import ScheduleStatements
from sqlqueue.storage.sql.tables import (
    FetchedRow,
    IdempotencyDigest,
    MessageKey,
    MessageRow,
    OutcomeWrite,
    VendorHooks,
)
from sqlqueue.storage.statements import statements_for
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


class ConsumingStatements(DeliveryStatements, LeaseStatements):
    """The subscriber's statements."""


class Dialect(ConsumingStatements, OperatingStatements, ScheduleStatements):
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

    # -- wake-ups (sqlqueue.wakeups) ---------------------------------------------------
    #: the database can wake its listeners at commit (PostgreSQL ``NOTIFY``)
    notifies_wakeups = False

    def notify_wakeup(self, cursor: CursorWrapper, topic: str) -> None:
        """``notify_wakeup``: tell listening runners, when the current transaction commits,
        that ``topic`` has a new message. No statement where the database cannot."""

    # -- idempotency keys (SPEC §9 "Idempotency window") -------------------------------
    def select_idempotency_keys(
        self, cursor: CursorWrapper, digests: Sequence[IdempotencyDigest], *, lock: bool
    ) -> dict[IdempotencyDigest, int]:
        """``select_idempotency_keys``: which of ``digests`` were published within their
        window, with the offset of that first publish. Seeks the primary key by its first
        column (64 bits of a digest: practically unique), the rest is checked here;
        ``lock``: a locking read, which sees keys committed after this transaction's
        snapshot."""
        if not digests:
            return {}
        q = self.quote
        highs = sorted({high for high, _ in digests})
        cursor.execute(
            f"SELECT {q('key_high')}, {q('key_low')}, {q('message_offset')} "
            f"FROM {q(IDEMPOTENCY_TABLE)} WHERE {q('key_high')} IN "
            f"({', '.join(['%s'] * len(highs))}) AND {q('expires_at')} > {self.now_ms_sql}"
            + (self.locking_read_suffix if lock else ""),
            highs,
        )
        wanted = set(digests)
        return {(int(h), int(lo)): int(o) for h, lo, o in cursor.fetchall()
                if (int(h), int(lo)) in wanted}

    def remember_idempotency_keys(
        self, cursor: CursorWrapper, keys: Sequence[tuple[int, int, int]], window_ms: int
    ) -> None:
        """``remember_idempotency_keys``: store (key_high, key_low, offset) of messages
        just published, until the database clock's now + ``window_ms``. A key still
        present but expired (not yet collected) is replaced."""
        if not keys:
            return
        q = self.quote
        columns = ("key_high", "key_low", "message_offset", "expires_at")
        one_row = f"(%s, %s, %s, {self.now_ms_sql} + %s)"
        upsert = self.upsert_clause(("key_high", "key_low"), {
            "message_offset": "{new}(message_offset)", "expires_at": "{new}(expires_at)"},
            table=IDEMPOTENCY_TABLE)
        cursor.execute(
            f"INSERT INTO {q(IDEMPOTENCY_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {', '.join([one_row] * len(keys))} {upsert}",
            [value for high, low, offset in keys for value in (high, low, offset, window_ms)],
        )

    def delete_expired_idempotency_keys_sql(self) -> str:
        """``delete_expired_idempotency_keys`` (sqlqueue.storage.statements.vendors)."""
        return self.sql.delete_expired_idempotency_keys(0)[0]

    def delete_expired_idempotency_keys(self, cursor: CursorWrapper, limit: int) -> int:
        """``delete_expired_idempotency_keys``: garbage-collect keys whose window has
        passed, at most ``limit`` per statement (idx_idempotency_expires)."""
        cursor.execute(*self.sql.delete_expired_idempotency_keys(limit))
        return int(cursor.rowcount)

    # -- insert_messages ---------------------------------------------------------------
    #: rows per publishing INSERT; also bounded by the driver's parameter limit
    max_rows_per_insert = 500
    insert_verb = "INSERT INTO"
    _INSERT_COLUMNS = (
        "topic", "partition_key", "id", "payload", "metadata", "created_at",
        "published_at", "priority", "deliver_after",
    )

    def insert_messages_sql(self, count: int) -> str:
        """``insert_messages``: a multi-row INSERT; a duplicate key fails the statement."""
        columns = ", ".join(self.quote(c) for c in self._INSERT_COLUMNS)
        now = self.now_ms_sql
        one_row = f"(%s, %s, %s, %s, %s, {now}, %s, %s, COALESCE({now} + %s, %s))"
        values = ", ".join([one_row] * count)
        return f"{self.insert_verb} {self.quote(MESSAGE_TABLE)} ({columns}) VALUES {values}"

    @staticmethod
    def insert_messages_params(rows: Sequence[MessageRow]) -> list[Any]:
        params: list[Any] = []
        for r in rows:
            params += [r.topic, r.partition_key, r.id, r.payload, r.metadata,
                       r.published_at, r.priority, r.delay_ms, r.deliver_at_ms]
        return params

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow]
    ) -> list[int] | None:
        """Insert ``rows``; return their offsets in order, or None if they cannot be known
        without reading them back.

        Raises ``IntegrityError`` if any row's (topic, partition_key, id) exists; the
        statement is then rolled back as a whole and the transaction stays usable.
        """
        cursor.execute(self.insert_messages_sql(len(rows)), self.insert_messages_params(rows))
        return self.inserted_offsets(cursor, len(rows))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        """The offsets the last ``insert_messages`` of ``count`` rows allocated, if known."""
        raise NotImplementedError

    # -- select_message_offsets --------------------------------------------------------
    def select_message_offsets_sql(self, count: int, *, lock: bool) -> str:
        """``select_message_offsets``: offsets of (partition_key, id) pairs of one topic.

        An OR of full-key equalities, which every vendor turns into ``count`` point
        lookups on ``idx_topic_partition_id`` (SQLite needs the topic in every term).
        """
        q = self.quote
        term = f"({q('topic')} = %s AND {q('partition_key')} = %s AND {q('id')} = %s)"
        suffix = self.locking_read_suffix if lock else ""
        return (
            f"SELECT {q('offset')}, {q('partition_key')}, {q('id')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {' OR '.join([term] * count)}{suffix}"
        )

    def select_message_offsets(
        self, cursor: CursorWrapper, topic: str, keys: Iterable[MessageKey], *, lock: bool
    ) -> dict[MessageKey, int]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        params: list[Any] = []
        for partition_key, message_id in wanted:
            params += [topic, partition_key, message_id]
        cursor.execute(self.select_message_offsets_sql(len(wanted), lock=lock), params)
        return {(pk, mid): int(offset) for offset, pk, mid in cursor.fetchall()}

    # -- database_now_ms ---------------------------------------------------------------
    def database_now_ms(self, cursor: CursorWrapper) -> int:
        """``database_now_ms``: the database clock, epoch milliseconds."""
        cursor.execute(f"SELECT {self.now_ms_sql}")
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    def is_galera(self, cursor: CursorWrapper) -> bool:
        """Is this server a node of a multi-writer cluster whose open transactions one
        node cannot see (Galera)?"""
        return False

    # -- lock waits --------------------------------------------------------------------
    def bound_lock_waits(self, cursor: CursorWrapper, seconds: int) -> None:
        """``bound_lock_waits``: give up a row-lock wait of this session after
        ``seconds`` (an error ``is_lock_wait`` recognises) instead of the server's
        default. Nothing to do where the connection's own busy timeout applies."""

    def is_lock_wait(self, error: BaseException) -> bool:
        """Did ``error`` end a wait for a lock (timeout, or chosen as a deadlock victim)?
        The transaction can be rolled back and tried again."""
        return False

    # -- errors ------------------------------------------------------------------------
    def is_duplicate_message(self, error: IntegrityError) -> bool:
        """Did ``error`` come from ``idx_topic_partition_id`` (an idempotent-publish hit)?"""
        raise NotImplementedError

    def max_statement_bytes(self) -> int:
        """Upper bound for one multi-row statement's size."""
        return 8 << 20

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
    "ConsumingStatements",
    "DeliveryStatements",
    "Dialect",
    "FetchedRow",
    "IdempotencyDigest",
    "LeaseStatements",
    "MessageKey",
    "MessageRow",
    "OperatingStatements",
    "OutcomeWrite",
    "PendingSummary",
    "VendorHooks",
]
