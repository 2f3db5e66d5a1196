"""PostgreSQL 14+ statements of the data source (through psycopg 3).

The writer publishes a chunk with COPY: in one transaction the rows stream into a
temporary table made for it (``create_staging``, ``copy_staging``), then one INSERT moves
them into the log in key order, skipping stored ids (``publish_staged``), and the commit
drops the table. COPY itself has no ``ON CONFLICT``, so copying straight into
queue_messages would fail a retried Spark task whole; the staging table keeps publishing
idempotent at COPY's speed. Made and dropped inside the transaction, it also works behind
PgBouncer in transaction mode, and a rolled-back chunk leaves nothing behind.
"""

from __future__ import annotations

from sqlqueue.integrations.spark.sql.base import INSERT_COLUMNS, Statements
from sqlqueue.storage.statements import Statement
from sqlqueue.storage.statements.postgresql import PostgreSQLVendor
from sqlqueue.storage.statements.publishing import PostgreSQLPublishing
from sqlqueue.storage.statements.sessions import PostgreSQLSessions
from sqlqueue.storage.statements.tables import MESSAGE_KEY, MESSAGE_TABLE

#: a transaction's staging table (temporary: no other session sees it)
STAGING_TABLE = "sqlqueue_spark_staging"
#: the columns a COPY row carries, in order (the topic is the INSERT's parameter)
STAGED_COLUMNS = INSERT_COLUMNS[1:]


class PostgreSQLStatements(PostgreSQLPublishing, PostgreSQLSessions, PostgreSQLVendor,
                           Statements):
    begin_sql = "BEGIN"

    def create_staging(self) -> Statement:
        """``create_staging``: the transaction's staging table, dropped when it ends;
        the column types are queue_messages' own."""
        q = self.quote
        columns = ", ".join(f"{q(name)} AS {q(name)}" for name in STAGED_COLUMNS)
        return (
            f"CREATE TEMPORARY TABLE {q(STAGING_TABLE)} ON COMMIT DROP "
            f"AS SELECT {columns} FROM {q(MESSAGE_TABLE)} WITH NO DATA",
            [],
        )

    def copy_staging(self) -> Statement:
        """``copy_staging``: COPY FROM STDIN into the staging table (rows as
        ``insert_messages`` takes them, the payload as bytes)."""
        return (f"COPY {self.quote(STAGING_TABLE)} ({self.names(STAGED_COLUMNS)}) FROM STDIN",
                [])

    def publish_staged(self, topic: str) -> Statement:
        """``publish_staged``: the staged rows into the log, in key order (the lock order
        every writer uses), skipping ids the topic stores; ``created_at`` from the clock
        of every published row (read after the transaction has its id)."""
        q = self.quote
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(INSERT_COLUMNS)}, {q('created_at')}) "
            f"SELECT %s, {self.names(STAGED_COLUMNS)}, {self.message_clock_sql} "
            f"FROM {q(STAGING_TABLE)} ORDER BY {q('partition_key')}, {q('id')} "
            + self.insert_if_absent_suffix(MESSAGE_KEY),
            [topic],
        )
