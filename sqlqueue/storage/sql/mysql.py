"""Statements for MySQL 8.0+ and MariaDB 10.11+.

``offset`` is a reserved word in MariaDB >= 10.6, so every identifier goes through
``quote_name``. Time comes from the server (``UTC_TIMESTAMP``), never from the session
time zone nor from the worker's clock.
"""

from __future__ import annotations

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.base import Dialect

ER_DUP_ENTRY = 1062


class MySQLDialect(Dialect):
    _autoinc_lock_mode: int | None = None  # read once per connection, when first needed

    vendor = "mysql"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"

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

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        code = error.args[0] if error.args else None
        return code == ER_DUP_ENTRY and "idx_topic_partition_id" in str(error)

    def max_statement_bytes(self) -> int:
        # Stay well under max_allowed_packet (16 MiB by default on MariaDB, 64 on MySQL).
        return 4 << 20
