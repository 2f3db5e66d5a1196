"""Statements for SQLite 3.35+ (the embedded default for development and the demo).

SQLite serialises writers on the database file, so no locking read is needed: a reader
inside a write transaction already sees every committed row.
"""

from __future__ import annotations

import sqlite3

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import MESSAGE_TABLE, Store
from sqlqueue.storage.statements.vendors import SQLiteVendor


class SQLiteStore(Store):
    vendor = "sqlite"
    now_ms_sql = SQLiteVendor.now_ms_sql
    locking_read_suffix = ""

    def max_query_params(self) -> int:
        # Django 5.2 says 999 whatever the library allows (so 99 messages an INSERT);
        # Django 6 asks the library, as this does (32,766 by default since SQLite 3.32):
        # the same statements on both.
        self.connection.ensure_connection()
        return int(self.connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # SQLite has one writer at a time and numbers the rows of a statement one after
        # the other (AUTOINCREMENT: never reusing a number); lastrowid is the last one.
        last = int(cursor.lastrowid)
        return list(range(last - count + 1, last + 1))

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
            and f"{MESSAGE_TABLE}.partition_key, {MESSAGE_TABLE}.id" in str(error)
        )

