"""Statements for MySQL 8.0+ and MariaDB 10.11+.

``offset`` is a reserved word in MariaDB >= 10.6, so every identifier goes through
``quote_name``. Time comes from the server (``UTC_TIMESTAMP``), never from the session
time zone nor from the worker's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from django.db import DatabaseError, IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import MESSAGE_TABLE, Dialect, MessageRow

ER_DUP_ENTRY = 1062


class MySQLDialect(Dialect):
    _autoinc_lock_mode: int | None = None  # read once per connection, when first needed

    vendor = "mysql"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"

    # -- insert_messages ---------------------------------------------------------------
    # The hot path of publishing. Two things make it cheap on these servers:
    # - created_at is left to the column's DEFAULT (the database clock, migration 0006):
    #   an expression repeated in every row costs the server more to parse than the
    #   row costs to store;
    # - the VALUES are written as literals, escaped by the client library's own
    #   mysql_real_escape_string for the connection's character set, the same escaping
    #   mysqlclient applies to parameters, minus its per-parameter type dispatch.
    max_rows_per_insert = 1000  # no parameters to bound it; max_statement_bytes does
    _LITERAL_COLUMNS = tuple(c for c in Dialect._INSERT_COLUMNS if c != "created_at")

    def created_at_default_sql(self, *, drop: bool = False) -> str:
        """``created_at_default`` (migration 0006): stamp ``created_at`` with the
        database clock when an INSERT leaves it out (``drop``: undo that)."""
        change = "DROP DEFAULT" if drop else f"SET DEFAULT ({self.now_ms_sql})"
        return (f"ALTER TABLE {self.quote(MESSAGE_TABLE)} ALTER COLUMN "
                f"{self.quote('created_at')} {change}")

    def insert_messages_statement(self, rows: Sequence[MessageRow]) -> bytes:
        """``insert_messages`` for MySQL: a multi-row INSERT with the values inlined, as
        bytes (what mysqlclient sends; no parameters left to interpolate)."""
        self.connection.ensure_connection()  # the escaping is the live connection's
        escape = self.connection.connection.string_literal
        names: dict[str, bytes] = {}  # topics and partition keys repeat: escape each once

        def name(value: str) -> bytes:
            found = names.get(value)
            if found is None:
                found = names[value] = escape(value.encode("utf-8"))
            return found

        values = []
        for r in rows:
            # A UUID made by sqlqueue is hex digits and dashes: nothing to escape.
            message_id = b"'%s'" % r.id.encode("ascii") if r.fresh_id else escape(
                r.id.encode("utf-8"))
            metadata = b"NULL" if r.metadata is None else escape(r.metadata.encode("utf-8"))
            deliver_after = (b"%d" % r.deliver_at_ms if r.delay_ms is None
                             else b"%s + %d" % (self._now_ms_bytes, r.delay_ms))
            values.append(b"(%s,%s,%s,_binary%s,%s,%d,%d,%s)" % (
                name(r.topic), name(r.partition_key), message_id, escape(r.payload), metadata,
                r.published_at, r.priority, deliver_after))
        return self._insert_head + b",".join(values)

    @cached_property
    def _insert_head(self) -> bytes:
        columns = ", ".join(self.quote(c) for c in self._LITERAL_COLUMNS)
        return f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({columns}) VALUES ".encode()

    @cached_property
    def _now_ms_bytes(self) -> bytes:
        return self.now_ms_sql.encode()

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow]
    ) -> list[int] | None:
        cursor.execute(self.insert_messages_statement(rows))  # type: ignore[arg-type]
        return self.inserted_offsets(cursor, len(rows))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # LAST_INSERT_ID() is the first row's offset. A multi-row INSERT ... VALUES is a
        # "simple insert": with innodb_autoinc_lock_mode 0 or 1 InnoDB allocates its
        # offsets as one consecutive run, in row order. Mode 2 (MySQL 8's default) does
        # not promise that in writing, so there the rows are read back instead.
        first = int(cursor.lastrowid)
        if count == 1 or self._consecutive_autoinc(cursor):
            return list(range(first, first + count))
        return None

    def _consecutive_autoinc(self, cursor: CursorWrapper) -> bool:
        if self._autoinc_lock_mode is None:
            cursor.execute("SELECT @@innodb_autoinc_lock_mode")
            row = cursor.fetchone()
            self._autoinc_lock_mode = int(row[0]) if row else 2
        return self._autoinc_lock_mode <= 1

    def upsert_clause(self, key: Sequence[str], assignments: dict[str, str]) -> str:
        # MySQL applies the assignments left to right; callers order them so that no
        # expression reads a column assigned before it.
        sets = ", ".join(
            f"{self.quote(column)} = {expression.replace('{new}(', 'VALUES(')}"
            for column, expression in assignments.items()
        )
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        # Not INSERT IGNORE: that would also turn real errors into warnings.
        q = self.quote
        return (
            f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) VALUES ({{values}}) "
            f"ON DUPLICATE KEY UPDATE {q(key[0])} = {q(key[0])}"
        )

    def discover_partitions_sql(self) -> str:
        # GROUP BY over the equality column too: that is the form both servers answer
        # with a loose index scan ("Using index for group-by"); DISTINCT is not.
        q = self.quote
        return (
            f"SELECT {q('partition_key')} FROM {q('queue_messages')} WHERE {q('topic')} = %s "
            f"GROUP BY {q('topic')}, {q('partition_key')}"
        )

    offset_index_hint = "FORCE INDEX (idx_topic_partition_offset)"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def partition_heads_sql(self) -> str:
        # MAX of the last index column, grouped by the ones before it: a loose index
        # scan ("Using index for group-by"), as for discovery.
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, MAX({q('offset')}) FROM {q('queue_messages')} "
            f"WHERE {q('topic')} = %s GROUP BY {q('topic')}, {q('partition_key')}"
        )

    def delete_messages_upto_sql(self) -> str:
        q = self.quote
        return (
            f"DELETE FROM {q('queue_messages')} WHERE {q('topic')} = %s AND "
            f"{q('partition_key')} = %s AND {q('offset')} <= %s ORDER BY {q('offset')} LIMIT %s"
        )

    _horizon_unavailable = False

    def write_horizon_sql(self) -> str:
        """``write_horizon``: from INNODB_TRX's snapshot, the start of the oldest open
        transaction that has written rows and of the newest transaction listed (whole
        seconds). Rows a transaction inserts get offsets after it started, so every offset
        allocated before the oldest writer started belongs to a finished transaction; and
        the snapshot was taken after the newest listed transaction started, so writers it
        misses started later (sqlqueue.horizon)."""
        return (
            "SELECT MIN(CASE WHEN trx_rows_modified > 0 THEN UNIX_TIMESTAMP(trx_started) END), "
            "MAX(UNIX_TIMESTAMP(trx_started)) FROM information_schema.INNODB_TRX"
        )

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """Needs the PROCESS privilege; without it this raises DatabaseError (once; then
        without asking again) and the caller assumes MAX_TRANSACTION_AGE. Inside a started
        transaction (a locking read has started it), a fresh snapshot lists the reader's
        own transaction: reading INNODB_TRX alone starts none."""
        if self._horizon_unavailable:
            raise DatabaseError("information_schema.INNODB_TRX is not readable")
        try:
            cursor.execute(self.write_horizon_sql())
        except DatabaseError:
            self._horizon_unavailable = True
            raise
        row = cursor.fetchone()
        oldest_writer, newest_start = row if row else (None, None)
        return WriteHorizon(
            None if oldest_writer is None else int(oldest_writer) * 1000,
            None if newest_start is None else int(newest_start) * 1000,
        )

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        code = error.args[0] if error.args else None
        return code == ER_DUP_ENTRY and "idx_topic_partition_id" in str(error)

    def max_statement_bytes(self) -> int:
        # Stay well under max_allowed_packet (16 MiB by default on MariaDB, 64 on MySQL).
        return 4 << 20
