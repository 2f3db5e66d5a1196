"""Statements for SQLite 3.35+ (the embedded default for development and the demo).

SQLite serialises writers on the database file, so no locking read is needed: a reader
inside a write transaction already sees every committed row.
"""

from __future__ import annotations

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.base import Dialect


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    locking_read_suffix = ""

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # SQLite has one writer at a time and numbers the rows of a statement one after
        # the other (AUTOINCREMENT: never reusing a number); lastrowid is the last one.
        last = int(cursor.lastrowid)
        return list(range(last - count + 1, last + 1))

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        return (
            "UNIQUE constraint failed" in str(error)
            and "queue_messages.partition_key, queue_messages.id" in str(error)
        )
