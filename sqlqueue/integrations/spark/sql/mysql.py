"""MySQL 8.0+ and MariaDB 10.11+ statements of the data source."""

from __future__ import annotations

from collections.abc import Sequence

from sqlqueue.integrations.spark.sql.base import (
    INSERT_COLUMNS,
    MESSAGES,
    Statement,
    Statements,
)


class MySQLStatements(Statements):
    vendor = "mysql"
    quote_char = "`"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"
    begin_sql = "START TRANSACTION"
    # A plain START TRANSACTION starts InnoDB's transaction only at the first table read.
    begin_snapshot_sql = "START TRANSACTION WITH CONSISTENT SNAPSHOT"

    def insert_if_absent_suffix(self, key: Sequence[str]) -> str:
        # Not INSERT IGNORE: that would turn every other error into a warning too.
        first = self.quote(key[0])
        return f"ON DUPLICATE KEY UPDATE {first} = {first}"

    def upsert_clause(self, key: Sequence[str], assignments: dict[str, str]) -> str:
        # Applied left to right: no expression may read a column assigned before it.
        sets = ", ".join(
            f"{self.quote(column)} = {expression.replace('{new}(', 'VALUES(')}"
            for column, expression in assignments.items()
        )
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def write_horizon(self) -> Statement:
        # Rows get offsets when inserted, after their transaction started: every offset
        # allocated before the oldest open writer started belongs to a finished
        # transaction. INNODB_TRX is a snapshot, taken after the newest transaction it
        # lists started: writers it misses started later (sqlqueue.horizon). Needs the
        # PROCESS privilege. The same statement as the consumer engine's.
        return (
            "SELECT MIN(CASE WHEN trx_rows_modified > 0 THEN UNIX_TIMESTAMP(trx_started) END) "
            "* 1000, MAX(UNIX_TIMESTAMP(trx_started)) * 1000 FROM information_schema.INNODB_TRX",
            [],
        )

    def discover_partitions(self, topic: str) -> Statement:
        # GROUP BY the equality column too: the form both servers answer with a loose
        # index scan of idx_topic_partition_offset.
        q = self.quote
        return (
            f"SELECT {q('partition_key')} FROM {q(MESSAGES)} WHERE {q('topic')} = %s "
            f"GROUP BY {q('topic')}, {q('partition_key')}",
            [topic],
        )

    def load_messages(self, path: str, topic: str) -> Statement:
        """``load_messages``: bulk-load a CSV file written by the writer (columns as in
        ``insert_messages``, no header, RFC 4180 quoting, NULL as an empty unquoted
        field). LOCAL loads skip duplicate keys with a warning, as IGNORE would, and the
        server also drops rows that break a CHECK constraint with only a warning: the
        caller compares what was stored with what was sent."""
        q = self.quote
        columns = [q(c) if c != "metadata" else "@metadata" for c in INSERT_COLUMNS[1:]]
        return (
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {q(MESSAGES)} CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
            f"({', '.join(columns)}) "
            f"SET {q('topic')} = %s, {q('metadata')} = NULLIF(@metadata, ''), "
            f"{q('created_at')} = {self.now_ms_sql}",
            [path, topic],
        )
