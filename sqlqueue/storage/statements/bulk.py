"""Named statements of bulk publishing, as the Spark writer does it: a multi-row INSERT
that skips stored ids, MySQL's ``LOAD DATA`` of a CSV file, and PostgreSQL's COPY through
a staging table.

On PostgreSQL the writer publishes a chunk in one transaction: the rows stream into a
temporary table made for it (``create_staging``, ``copy_staging``), then one INSERT moves
them into the log in key order, skipping stored ids (``publish_staged``), and the commit
drops the table. COPY itself has no ``ON CONFLICT``, so copying straight into
queue_messages would fail a retried Spark task whole; the staging table keeps publishing
idempotent at COPY's speed. Made and dropped inside the transaction, it also works behind
PgBouncer in transaction mode, and a rolled-back chunk leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlqueue.storage.statements.publishing import VALUE_COLUMNS
from sqlqueue.storage.statements.tables import MESSAGE_KEY, MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: a transaction's staging table (temporary: no other session sees it)
STAGING_TABLE = "sqlqueue_spark_staging"
#: the columns a bulk row carries, in order (the topic is the statement's parameter)
BULK_COLUMNS = VALUE_COLUMNS[1:]


class BulkStatements(Vendor):
    """Bulk publishing, for any vendor (a mixin of ``Statements``)."""

    def store_new_messages(self, topic: str, rows: Sequence[Sequence[Any]]) -> Statement:
        """``store_new_messages``: a multi-row INSERT that skips rows whose (topic,
        partition_key, id) is stored (idempotent publish: a retried Spark task inserts
        nothing twice). ``rows``: (partition_key, id, payload (str), metadata,
        published_at, priority, deliver_after)."""
        one = f"(%s, %s, %s, %s, %s, %s, %s, %s, {self.message_clock_sql})"
        params: list[Any] = []
        for partition_key, message_id, payload, *rest in rows:
            # Bytes: SQLite would store a str in the BLOB column as TEXT.
            params += [topic, partition_key, message_id, payload.encode("utf-8"), *rest]
        return (
            f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(VALUE_COLUMNS)}, "
            f"{self.quote('created_at')}) VALUES {', '.join([one] * len(rows))} "
            + self.insert_if_absent_suffix(MESSAGE_KEY),
            params,
        )

    def load_messages(self, path: str, topic: str) -> Statement:
        """``load_messages``: bulk-load a CSV file (MySQL/MariaDB only)."""
        raise NotImplementedError(f"{self.vendor} has no LOAD DATA")


class MySQLBulk(BulkStatements):
    """MySQL's and MariaDB's (a mixin of ``MySQLStatements``)."""

    def load_messages(self, path: str, topic: str) -> Statement:
        """``load_messages``: bulk-load a CSV file written by the writer (columns as in
        ``store_new_messages``, no header, RFC 4180 quoting, NULL as an empty unquoted
        field). LOCAL loads skip duplicate keys with a warning, as IGNORE would, and the
        server also drops rows that break a CHECK constraint with only a warning: the
        caller compares what was stored with what was sent."""
        q = self.quote
        columns = [q(c) if c != "metadata" else "@metadata" for c in BULK_COLUMNS]
        return (
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {q(MESSAGE_TABLE)} CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
            f"({', '.join(columns)}) "
            f"SET {q('topic')} = %s, {q('metadata')} = NULLIF(@metadata, ''), "
            f"{q('created_at')} = {self.now_ms_sql}",
            [path, topic],
        )


class PostgreSQLBulk(BulkStatements):
    """PostgreSQL's COPY through a staging table (a mixin of ``PostgreSQLStatements``)."""

    def create_staging(self) -> Statement:
        """``create_staging``: the transaction's staging table, dropped when it ends;
        the column types are queue_messages' own."""
        q = self.quote
        columns = ", ".join(f"{q(name)} AS {q(name)}" for name in BULK_COLUMNS)
        return (
            f"CREATE TEMPORARY TABLE {q(STAGING_TABLE)} ON COMMIT DROP "
            f"AS SELECT {columns} FROM {q(MESSAGE_TABLE)} WITH NO DATA",
            [],
        )

    def copy_staging(self) -> Statement:
        """``copy_staging``: COPY FROM STDIN into the staging table (rows as
        ``store_new_messages`` takes them, the payload as bytes)."""
        return (f"COPY {self.quote(STAGING_TABLE)} ({self.names(BULK_COLUMNS)}) FROM STDIN",
                [])

    def publish_staged(self, topic: str) -> Statement:
        """``publish_staged``: the staged rows into the log, in key order (the lock order
        every writer uses), skipping ids the topic stores; ``created_at`` from the clock
        of every published row (read after the transaction has its id)."""
        q = self.quote
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(VALUE_COLUMNS)}, {q('created_at')}) "
            f"SELECT %s, {self.names(BULK_COLUMNS)}, {self.message_clock_sql} "
            f"FROM {q(STAGING_TABLE)} ORDER BY {q('partition_key')}, {q('id')} "
            + self.insert_if_absent_suffix(MESSAGE_KEY),
            [topic],
        )
