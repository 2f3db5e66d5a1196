"""Statements for SQLite 3.35+ (the embedded default for development and the demo).

SQLite serialises writers on the database file, so no locking read is needed: a reader
inside a write transaction already sees every committed row.
"""

from __future__ import annotations

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import MESSAGE_TABLE, Dialect
from sqlqueue.storage.statements.vendors import SQLiteVendor


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now_ms_sql = SQLiteVendor.now_ms_sql
    locking_read_suffix = ""

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # SQLite has one writer at a time and numbers the rows of a statement one after
        # the other (AUTOINCREMENT: never reusing a number); lastrowid is the last one.
        last = int(cursor.lastrowid)
        return list(range(last - count + 1, last + 1))

    offset_index_hint = "INDEXED BY idx_topic_partition_offset"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"MAX({a}, {b})"  # the scalar max of its arguments

    def union_member(self, select: str) -> str:
        # SQLite allows ORDER BY and LIMIT only at the end of a whole compound SELECT.
        return f"SELECT * FROM ({select})"

    def delete_messages_upto_sql(self) -> str:
        # DELETE ... LIMIT needs a compile-time option SQLite builds usually lack.
        q = self.quote
        table, offset = q("queue_messages"), q("offset")
        return (
            f"DELETE FROM {table} WHERE {offset} IN (SELECT {offset} FROM {table} WHERE "
            f"{q('topic')} = %s AND {q('partition_key')} = %s AND {offset} <= %s "
            f"ORDER BY {offset} LIMIT %s)"
        )

    def delete_expired_idempotency_keys_sql(self) -> str:
        q = self.quote
        table, expires = q("queue_idempotency_keys"), q("expires_at")
        return (f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE "
                f"{expires} <= {self.now_ms_sql} ORDER BY {expires} LIMIT %s)")

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        # One writer at a time: a row is committed before the next offset is allocated,
        # so no row can ever appear below one already visible.
        return None

    def is_lock_wait(self, error: BaseException) -> bool:
        # The connection's busy timeout (Django's ``timeout`` option) ran out.
        return "database is locked" in str(error)

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        return (
            "UNIQUE constraint failed" in str(error)
            and "queue_messages.partition_key, queue_messages.id" in str(error)
        )

    def offset_counter_sql(self) -> str:
        """``offset_counter``: the last offset AUTOINCREMENT handed out."""
        return f"SELECT seq FROM sqlite_sequence WHERE name = '{MESSAGE_TABLE}'"
