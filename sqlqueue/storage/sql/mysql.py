"""Statements for MySQL 8.0+ and MariaDB 10.11+.

``offset`` is a reserved word in MariaDB >= 10.6, so every identifier goes through
``quote_name``. Time comes from the server (``UTC_TIMESTAMP``), never from the session
time zone nor from the worker's clock.
"""

from __future__ import annotations

from django.db import IntegrityError

from sqlqueue.storage.sql.base import Dialect

ER_DUP_ENTRY = 1062


class MySQLDialect(Dialect):
    vendor = "mysql"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        code = error.args[0] if error.args else None
        return code == ER_DUP_ENTRY and "idx_topic_partition_id" in str(error)

    def max_statement_bytes(self) -> int:
        # Stay well under max_allowed_packet (16 MiB by default on both servers).
        return 4 << 20
