"""What differs between the databases, for statements built without a connection.

A ``Vendor`` knows its identifier quoting, its clock, its locking read, its upserts, how
to list a topic's partitions and how to read the write horizon. Both executors use the
same vendor objects: Django's (``sqlqueue.storage.sql``) and the Spark executors' own
DB-API connections (``sqlqueue.integrations.spark.sql``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlqueue.horizon import UNKNOWN, WriteHorizon
from sqlqueue.storage.statements.tables import MESSAGE_TABLE

#: SQL with ``%s`` placeholders, and its parameters
Statement = tuple[str, list[Any]]

_NEW = re.compile(r"\{new\}\(([^)]*)\)")  # {new}(col): the would-be-inserted value
_EXCLUDED = r"excluded.\1"
#: a double-quoted identifier not qualified by a table name (nor part of a longer one)
_BARE_COLUMN = re.compile(r'(?<![.\w"])("[^"]+")')


class Vendor:
    """The hooks every statement builder relies on; one subclass per database."""

    vendor = ""
    quote_char = '"'
    #: the database clock in epoch milliseconds (one value for the whole statement)
    now_ms_sql = ""
    #: appended to a read that must see the newest commits and hold them until commit
    locking_read_suffix = ""

    @property
    def message_clock_sql(self) -> str:
        """The clock a row of queue_messages is stamped with (``created_at``), which the
        write horizon compares with the oldest open transaction."""
        return self.now_ms_sql

    def quote(self, name: str) -> str:
        return f"{self.quote_char}{name}{self.quote_char}"

    def names(self, names: Sequence[str], prefix: str = "") -> str:
        """Quoted, comma-separated column names (each after ``prefix``)."""
        return ", ".join(f"{prefix}{self.quote(n)}" for n in names)

    @staticmethod
    def marks(count: int) -> str:
        return ", ".join(["%s"] * count)

    def database_now_ms(self) -> Statement:
        """``database_now_ms``: the database clock."""
        return f"SELECT {self.now_ms_sql}", []

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        """``ON DUPLICATE KEY UPDATE`` / ``ON CONFLICT DO UPDATE``; ``{new}(col)`` in an
        expression is the value the INSERT would have written, a bare column the stored
        row's. ``table``: the INSERT's (PostgreSQL names the stored row's columns by it)."""
        raise NotImplementedError

    def insert_if_absent_suffix(self, key: Sequence[str]) -> str:
        """Turns an INSERT into one that skips rows whose ``key`` is stored."""
        raise NotImplementedError

    def discover_partitions(self, topic: str) -> Statement:
        """``discover_partitions``: the distinct partition keys of a topic by a loose
        index scan of ``idx_topic_partition_offset``: one seek per partition, so the cost
        grows with the number of partitions, not of messages."""
        raise NotImplementedError

    def partition_heads(self, topic: str) -> Statement:
        """``partition_heads``: each partition of a topic with its newest offset, by a
        loose index scan of ``idx_topic_partition_offset`` (one seek per partition)."""
        raise NotImplementedError

    def write_horizon(self) -> Statement | None:
        """``write_horizon``: what the database shows of open transactions (read inside
        a started transaction), for ``parse_write_horizon``; None where no transaction
        can commit out of offset order."""
        return None

    def parse_write_horizon(self, row: Sequence[Any] | None) -> WriteHorizon:
        """The ``sqlqueue.horizon.WriteHorizon`` that ``write_horizon``'s row says."""
        raise NotImplementedError


class MySQLVendor(Vendor):
    """MySQL 8.0+ and MariaDB 10.11+."""

    vendor = "mysql"
    quote_char = "`"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        # MySQL applies the assignments left to right; callers order them so that no
        # expression reads a column assigned before it.
        sets = ", ".join(
            f"{self.quote(column)} = {expression.replace('{new}(', 'VALUES(')}"
            for column, expression in assignments.items()
        )
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def insert_if_absent_suffix(self, key: Sequence[str]) -> str:
        # Not INSERT IGNORE: that would turn every other error into a warning too.
        first = self.quote(key[0])
        return f"ON DUPLICATE KEY UPDATE {first} = {first}"

    def discover_partitions(self, topic: str) -> Statement:
        # GROUP BY the equality column too: the form both servers answer with a loose
        # index scan ("Using index for group-by"); DISTINCT is not.
        q = self.quote
        return (
            f"SELECT {q('partition_key')} FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s "
            f"GROUP BY {q('topic')}, {q('partition_key')}",
            [topic],
        )

    def partition_heads(self, topic: str) -> Statement:
        # MAX of the last index column, grouped by the ones before it: a loose index
        # scan ("Using index for group-by"), as for discovery.
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, MAX({q('offset')}) FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('topic')} = %s GROUP BY {q('topic')}, {q('partition_key')}",
            [topic],
        )

    def write_horizon(self) -> Statement:
        # From INNODB_TRX's snapshot, the start of the oldest open transaction that has
        # written rows and of the newest transaction listed (whole seconds). Rows a
        # transaction inserts get offsets after it started, so every offset allocated
        # before the oldest writer started belongs to a finished transaction; and the
        # snapshot was taken after the newest listed transaction started, so writers it
        # misses started later (sqlqueue.horizon). Needs the PROCESS privilege.
        return (
            "SELECT MIN(CASE WHEN trx_rows_modified > 0 THEN UNIX_TIMESTAMP(trx_started) END) "
            "* 1000, MAX(UNIX_TIMESTAMP(trx_started)) * 1000 FROM information_schema.INNODB_TRX",
            [],
        )

    def parse_write_horizon(self, row: Sequence[Any] | None) -> WriteHorizon:
        oldest_writer, newest_start = row if row else (None, None)
        return WriteHorizon(None if oldest_writer is None else int(oldest_writer),
                            None if newest_start is None else int(newest_start))


class OnConflictVendor(Vendor):
    """SQLite and PostgreSQL: the same ``ON CONFLICT`` upserts, and neither has a loose
    index scan."""

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        # Every right-hand side is evaluated against the old row (both databases).
        sets = ", ".join(
            f"{self.quote(column)} = "
            f"{self.stored_columns(_NEW.sub(_EXCLUDED, expression), table)}"
            for column, expression in assignments.items()
        )
        return f"ON CONFLICT ({self.names(key)}) DO UPDATE SET {sets}"

    def stored_columns(self, expression: str, table: str) -> str:
        """``expression`` with its bare columns naming the stored row's (SQLite reads
        them so already)."""
        return expression

    def insert_if_absent_suffix(self, key: Sequence[str]) -> str:
        return f"ON CONFLICT ({self.names(key)}) DO NOTHING"

    def partition_keys_cte(self) -> str:
        """A recursive query makes the loose index scan: each step seeks the next key
        after the previous one in idx_topic_partition_offset (a MIN over an index prefix
        is one seek on both databases). Takes the topic twice."""
        q = self.quote
        table, topic, key = q(MESSAGE_TABLE), q("topic"), q("partition_key")
        return (
            f"WITH RECURSIVE keys(k) AS ("
            f"SELECT MIN({key}) FROM {table} WHERE {topic} = %s "
            f"UNION ALL SELECT (SELECT MIN({key}) FROM {table} WHERE {topic} = %s "
            f"AND {key} > keys.k) FROM keys WHERE keys.k IS NOT NULL)"
        )

    def discover_partitions(self, topic: str) -> Statement:
        return (f"{self.partition_keys_cte()} SELECT k FROM keys WHERE k IS NOT NULL",
                [topic, topic])

    def partition_heads(self, topic: str) -> Statement:
        # The recursive seek of discovery, then one MAX seek per key.
        q = self.quote
        return (
            f"{self.partition_keys_cte()} SELECT k, (SELECT MAX({q('offset')}) FROM "
            f"{q(MESSAGE_TABLE)} WHERE {q('topic')} = %s AND {q('partition_key')} = keys.k) "
            f"FROM keys WHERE k IS NOT NULL",
            [topic, topic, topic],
        )


class SQLiteVendor(OnConflictVendor):
    """SQLite 3.35+: one writer at a time, so every visible row is settled."""

    vendor = "sqlite"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


def epoch_ms(clock: str) -> str:
    """A PostgreSQL timestamp expression in epoch milliseconds."""
    # EXTRACT(EPOCH ...) is numeric (PostgreSQL 14+): FLOOR truncates to the millisecond
    # like the other vendors' clocks, where a cast alone would round up.
    return f"FLOOR(EXTRACT(EPOCH FROM {clock}) * 1000)::bigint"


class PostgreSQLVendor(OnConflictVendor):
    """PostgreSQL 14+. ``now_ms_sql`` is ``statement_timestamp()``: one value for the
    whole statement, as the other vendors' clocks are."""

    vendor = "postgresql"
    now_ms_sql = f"({epoch_ms('statement_timestamp()')})"
    # Waits for a concurrent writer of the row, then reads its newest committed version.
    locking_read_suffix = " FOR SHARE"

    @property
    def message_clock_sql(self) -> str:
        # CASE evaluates its condition first: pg_current_xact_id() gives the transaction
        # its id (if it has none yet) before the clock is read, the order the exact
        # write horizon rests on (sqlqueue.storage.sql.postgresql).
        return (f"(CASE WHEN pg_current_xact_id() IS NOT NULL THEN "
                f"{epoch_ms('clock_timestamp()')} END)")

    def stored_columns(self, expression: str, table: str) -> str:
        # In ON CONFLICT DO UPDATE a bare column is ambiguous (the stored row's, or
        # EXCLUDED's): qualify it with the table.
        if not table:
            raise ValueError("upsert_clause() needs table= on PostgreSQL")
        target = self.quote(table)
        return _BARE_COLUMN.sub(lambda m: f"{target}.{m.group(1)}", expression)

    def write_horizon(self) -> Statement:
        # The clock created_at is stamped from, read first; then, from a fresh copy of
        # pg_stat_activity, the start of the oldest transaction of this database that
        # holds a transaction id, and how many such sessions this role may not see (other
        # roles' sessions, without pg_read_all_stats); and how many prepared transactions
        # this database has. The LATERAL subquery depends on the clock's row, so it runs
        # after it (and after pg_stat_clear_snapshot() dropped the copy this transaction
        # may have cached). Why this is exact: sqlqueue.storage.sql.postgresql.
        this_database = "(SELECT oid FROM pg_database WHERE datname = current_database())"
        return (
            f"WITH c AS MATERIALIZED (SELECT pg_stat_clear_snapshot() AS cleared, "
            f"{epoch_ms('clock_timestamp()')} AS now_ms) "
            f"SELECT c.now_ms, a.oldest, a.hidden, (SELECT COUNT(*) FROM pg_prepared_xacts "
            f"WHERE database = current_database()) FROM c CROSS JOIN LATERAL ("
            f"SELECT {epoch_ms('MIN(xact_start)')} AS oldest, "
            f"COUNT(*) FILTER (WHERE xact_start IS NULL) AS hidden FROM pg_stat_activity "
            f"WHERE backend_xid IS NOT NULL AND datid = {this_database} "
            f"AND c.now_ms IS NOT NULL) a",
            [],
        )

    def parse_write_horizon(self, row: Sequence[Any] | None) -> WriteHorizon:
        # Unknown while a session holding a transaction id is not readable by this role,
        # or a prepared transaction (no session, hence no start time) is pending.
        assert row is not None
        now_ms, oldest, hidden, prepared = row
        if hidden or prepared:
            return UNKNOWN
        return WriteHorizon(None if oldest is None else int(oldest), int(now_ms), 0)
