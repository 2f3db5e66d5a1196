"""MySQL 8.0+ and MariaDB 10.11+ statements of the data source."""

from __future__ import annotations

from sqlqueue.integrations.spark.sql.base import INSERT_COLUMNS, Statements
from sqlqueue.storage.statements import Statement
from sqlqueue.storage.statements.sessions import MySQLSessions
from sqlqueue.storage.statements.tables import MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import MySQLVendor


class MySQLStatements(MySQLSessions, MySQLVendor, Statements):
    begin_sql = "START TRANSACTION"
    # A plain START TRANSACTION starts InnoDB's transaction only at the first table read.
    begin_snapshot_sql = "START TRANSACTION WITH CONSISTENT SNAPSHOT"

    def load_messages(self, path: str, topic: str) -> Statement:
        """``load_messages``: bulk-load a CSV file written by the writer (columns as in
        ``insert_messages``, no header, RFC 4180 quoting, NULL as an empty unquoted
        field). LOCAL loads skip duplicate keys with a warning, as IGNORE would, and the
        server also drops rows that break a CHECK constraint with only a warning: the
        caller compares what was stored with what was sent."""
        q = self.quote
        columns = [q(c) if c != "metadata" else "@metadata" for c in INSERT_COLUMNS[1:]]
        return (
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {q(MESSAGE_TABLE)} CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
            f"({', '.join(columns)}) "
            f"SET {q('topic')} = %s, {q('metadata')} = NULLIF(@metadata, ''), "
            f"{q('created_at')} = {self.now_ms_sql}",
            [path, topic],
        )
