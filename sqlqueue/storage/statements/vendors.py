"""What differs between the databases, for statements built without a connection.

A ``Vendor`` knows its identifier quoting, its clock, its locking read, its upserts, how
to list a topic's partitions and how to read the write horizon. Both executors use the
same vendor objects: Django's (``sqlqueue.storage.sql``) and the Spark executors' own
DB-API connections (``sqlqueue.integrations.spark.connect``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.statements.tables import IDEMPOTENCY_TABLE, MESSAGE_TABLE

#: SQL with ``%s`` placeholders, and its parameters
Statement = tuple[str, list[Any]]

_NEW = re.compile(r"\{new\}\(([^)]*)\)")  # {new}(col): the would-be-inserted value
_EXCLUDED = r"excluded.\1"


class Vendor:
    """The hooks every statement builder relies on; one subclass per database."""

    vendor = ""
    quote_char = '"'
    #: the database clock in epoch milliseconds (one value for the whole statement)
    now_ms_sql = ""
    #: appended to a read that must see the newest commits and hold them until commit
    locking_read_suffix = ""
    #: which server a statement ran on: the same text for every connection to one server,
    #: another for any other server (a promoted replica, another cluster node)
    server_identity_sql = "''"
    #: appended to an INSERT of one message to read back the offset it allocated (where
    #: the driver's lastrowid does not tell it)
    returning_offset_sql = ""
    #: makes the per-partition probes use idx_topic_partition_offset without weighing
    #: the other indexes first: planning, not reading, is what they cost otherwise
    offset_index_hint = ""
    #: the same for a group's rows of a topic (idx_group_topic_offset)
    group_index_hint = ""

    #: a parameter that is an integer (or NULL) wherever it stands: PostgreSQL types a
    #: CASE whose branches are all bare parameters as text
    integer_mark = "%s"
    #: a text parameter (never NULL) compared with a text column of the queue tables: a
    #: topic, partition key, message id, group, subscriber or owner name. Plain here;
    #: MySQL's says why it is not there.
    text_mark = "%s"
    #: integer division of two integer expressions, truncated ("{a}", "{b}")
    int_div_sql = "({a}) / ({b})"

    def ms_since_sql(self, column_sql: str) -> str:
        """Milliseconds from the database time in ``column_sql`` to now: negative when it
        was stamped after this statement's now (another transaction's renewal, committed
        while this one ran)."""
        return f"{self.now_ms_sql} - {column_sql}"

    @property
    def message_clock_sql(self) -> str:
        """The clock a row of queue_messages is stamped with (``created_at``), which the
        write horizon compares with the oldest open transaction (sqlqueue.horizon)."""
        return self.now_ms_sql

    @staticmethod
    def greatest_sql(a: str, b: str) -> str:
        """The larger of two expressions."""
        return f"GREATEST({a}, {b})"

    def seek_sql(self, column: str, where: str, *, last: bool = False) -> str:
        """A scalar subquery: the least (``last``: the greatest) ``column`` of the
        messages matching ``where``, NULL if none does. ``where`` pins an index prefix
        that ``column`` follows, so it is one seek: a MIN or MAX, which MySQL and SQLite
        answer with that seek while planning ("Select tables optimized away")."""
        return (f"(SELECT {'MAX' if last else 'MIN'}({column}) "
                f"FROM {self.quote(MESSAGE_TABLE)} WHERE {where})")

    @staticmethod
    def union_member(select: str) -> str:  # with its own ORDER BY and LIMIT, in a UNION
        return f"({select})"

    def quote(self, name: str) -> str:
        return f"{self.quote_char}{name}{self.quote_char}"

    def names(self, names: Sequence[str], prefix: str = "") -> str:
        """Quoted, comma-separated column names (each after ``prefix``)."""
        return ", ".join(f"{prefix}{self.quote(n)}" for n in names)

    @staticmethod
    def marks(count: int) -> str:
        return ", ".join(["%s"] * count)

    def text_marks(self, count: int) -> str:
        """``count`` comma-separated ``text_mark``s (an IN list of names)."""
        return ", ".join([self.text_mark] * count)

    def partitions_filter(self, partitions: Sequence[str] | None) -> tuple[str, list[Any]]:
        """`` AND partition_key IN (...)``: primary-key lookups, so that a locking
        statement locks those rows only (no scan of the (group, topic)'s other rows)."""
        if partitions is None:
            return "", []
        return (f" AND {self.quote('partition_key')} IN ({self.text_marks(len(partitions))})",
                list(partitions))

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

    # Garbage collection, at most ``limit`` rows per statement (short locks): the oldest
    # rows of a partition, idempotency keys whose window has passed. ``offset_counter``:
    # where the offset counter stands (NULL, no row: unknown; lower: writes were lost).
    def delete_messages_upto(self, topic: str, partition: str, upto: int,
                             limit: int) -> Statement:
        raise NotImplementedError

    def delete_expired_idempotency_keys(self, limit: int) -> Statement:
        raise NotImplementedError

    def offset_counter(self) -> Statement:
        raise NotImplementedError

    def delete_messages_in_window(self, topic: str, after: int, upto: int,
                                  limits: Sequence[tuple[str, int]]) -> Statement:
        """``delete_messages_in_window``: garbage-collect a window of the log by primary
        key: the rows of ``topic`` with after < offset <= upto, each at or below its
        partition's limit (``limits``: (partition, limit), at least one; a partition not
        named keeps its rows). How a deep collection sweeps a backlog: the window reads
        each page of the table once, in order, where deleting partition by partition
        came back to every page once per partition (a row of each on every page), and
        through a buffer pool smaller than the table read it from disk each time
        (MariaDB, 2M rows, 128 MB buffer pool: 4,000-7,000 rows/s by partition; by
        window 60,000 with ids in offset order, 15,000-28,000 with random ids, whose
        unique index is then what is read from disk). Every vendor the same; at most
        ``upto - after`` rows, so its locks are short."""
        q = self.quote
        offset = q("offset")
        bounds = " ".join([f"WHEN {self.text_mark} THEN {self.integer_mark}"] * len(limits))
        return (
            f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {offset} > %s AND {offset} <= %s "
            f"AND {q('topic')} = {self.text_mark} "
            f"AND {offset} <= CASE {q('partition_key')} {bounds} END",
            [after, upto, topic, *(value for limit in limits for value in limit)],
        )


class MySQLVendor(Vendor):
    """MySQL 8.0+ and MariaDB 10.11+."""

    vendor = "mysql"
    quote_char = "`"
    now_ms_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    # LOCK IN SHARE MODE (not FOR SHARE) is understood by both MySQL 8 and MariaDB.
    locking_read_suffix = " LOCK IN SHARE MODE"
    # MariaDB has no server_uuid; server_id is unique within a replication topology (it
    # must be), host and port tell apart servers that share one.
    server_identity_sql = "CONCAT(@@hostname, ':', @@port, ' server_id ', @@server_id)"
    offset_index_hint = "FORCE INDEX (idx_topic_partition_offset)"
    group_index_hint = "FORCE INDEX (idx_group_topic_offset)"
    # A string parameter arrives in the connection's collation (Django's MySQL connection:
    # utf8mb4_general_ci), not the queue tables' binary one (utf8mb4_nopad_bin on
    # MariaDB). The comparison then runs in the column's collation, but the optimizer no
    # longer takes ``topic = 'x'`` for a constant prefix of an index: ``... ORDER BY
    # offset LIMIT n`` filesorted a whole partition (garbage collection: 2.5 s per
    # statement at 2M rows), a GROUP BY loose scan sorted its groups. A ``_binary``
    # literal has no collation of its own to clash: the server converts it to the
    # column's character set and collation (coercibility: the column's IMPLICIT wins over
    # a literal's COERCIBLE), whatever binary collation the tables have and whatever the
    # session's is, which stays untouched. The bytes are UTF-8 (every executor sends
    # utf8mb4, checked by ``connection_charset``). (``_utf8mb4`` would not do: the
    # same character set, so no conversion, and the clash stays.)
    # tests/integration/test_plans_at_scale.py reads the plans.
    text_mark = "_binary%s"

    def ms_since_sql(self, column_sql: str) -> str:
        """As the base's, but signed: the time columns are BIGINT UNSIGNED, and MySQL
        refuses an unsigned difference below zero (error 1690, "BIGINT UNSIGNED value is
        out of range") instead of returning it: a lease renewed by another runner after
        this statement's now made the whole pass fail and reconnect."""
        return f"{self.now_ms_sql} - CAST({column_sql} AS SIGNED)"

    int_div_sql = "({a}) DIV ({b})"  # "/" would give a DECIMAL

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
            f"SELECT {q('partition_key')} FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('topic')} = {self.text_mark} "
            f"GROUP BY {q('topic')}, {q('partition_key')}",
            [topic],
        )

    def partition_heads(self, topic: str) -> Statement:
        # MAX of the last index column, grouped by the ones before it: a loose index
        # scan ("Using index for group-by"), as for discovery.
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, MAX({q('offset')}) FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('topic')} = {self.text_mark} GROUP BY {q('topic')}, {q('partition_key')}",
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

    def delete_messages_upto(self, topic: str, partition: str, upto: int,
                             limit: int) -> Statement:
        q = self.quote
        return (
            f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = {self.text_mark} AND "
            f"{q('partition_key')} = {self.text_mark} AND {q('offset')} <= %s "
            f"ORDER BY {q('offset')} LIMIT %s",
            [topic, partition, upto, limit],
        )

    def delete_expired_idempotency_keys(self, limit: int) -> Statement:
        q = self.quote
        return (f"DELETE FROM {q(IDEMPOTENCY_TABLE)} WHERE {q('expires_at')} <= "
                f"{self.now_ms_sql} ORDER BY {q('expires_at')} LIMIT %s", [limit])

    def offset_counter(self) -> Statement:
        # The next offset AUTO_INCREMENT hands out. (MySQL 8 may answer from its
        # statistics cache, information_schema_stats_expiry: a stale value is an older,
        # lower one, never a false step back after a newer one.)
        return ("SELECT AUTO_INCREMENT FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", [MESSAGE_TABLE])


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

    # Garbage collection without DELETE ... LIMIT (SQLite builds usually lack it,
    # PostgreSQL has none): a subquery chooses at most LIMIT rows, in ``gc_order`` (the
    # oldest messages of a partition) or by expiry (idempotency keys, by ``row_address``).
    chosen_rows_sql = "{column} IN ({select})"
    row_address = "rowid"
    gc_order: tuple[str, ...] = ("offset",)

    def _delete_chosen(self, table: str, column: str, where: str, order: str,
                       params: list[Any]) -> Statement:
        select = f"SELECT {column} FROM {table} WHERE {where} ORDER BY {order} LIMIT %s"
        return (f"DELETE FROM {table} WHERE "
                + self.chosen_rows_sql.format(column=column, select=select), params)

    def delete_messages_upto(self, topic: str, partition: str, upto: int,
                             limit: int) -> Statement:
        q = self.quote
        return self._delete_chosen(
            q(MESSAGE_TABLE), q("offset"),
            f"{q('topic')} = %s AND {q('partition_key')} = %s AND {q('offset')} <= %s",
            self.names(self.gc_order), [topic, partition, upto, limit])

    def delete_expired_idempotency_keys(self, limit: int) -> Statement:
        expires = self.quote("expires_at")
        return self._delete_chosen(self.quote(IDEMPOTENCY_TABLE), self.row_address,
                                   f"{expires} <= {self.now_ms_sql}", expires, [limit])

    def partition_keys_cte(self) -> str:
        """A recursive query makes the loose index scan: each step seeks the next key
        after the previous one in idx_topic_partition_offset (``seek_sql``: one seek on
        every database). Takes the topic twice."""
        q = self.quote
        topic, key = q("topic"), q("partition_key")
        return (
            f"WITH RECURSIVE keys(k) AS ("
            f"SELECT {self.seek_sql(key, f'{topic} = %s')} "
            f"UNION ALL SELECT {self.seek_sql(key, f'{topic} = %s AND {key} > keys.k')} "
            f"FROM keys WHERE keys.k IS NOT NULL)"
        )

    def discover_partitions(self, topic: str) -> Statement:
        return (f"{self.partition_keys_cte()} SELECT k FROM keys WHERE k IS NOT NULL",
                [topic, topic])

    def partition_heads(self, topic: str) -> Statement:
        # The recursive seek of discovery, then one MAX seek per key.
        q = self.quote
        newest = self.seek_sql(q("offset"), f"{q('topic')} = %s AND {q('partition_key')} = keys.k",
                               last=True)
        return (f"{self.partition_keys_cte()} SELECT k, {newest} FROM keys WHERE k IS NOT NULL",
                [topic, topic, topic])


class SQLiteVendor(OnConflictVendor):
    """SQLite 3.35+: one writer at a time, so every visible row is settled."""

    vendor = "sqlite"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    offset_index_hint = "INDEXED BY idx_topic_partition_offset"
    group_index_hint = "INDEXED BY idx_group_topic_offset"
    # One writer at a time: BEGIN IMMEDIATE takes the write lock at once, so a writer
    # waits for another instead of failing halfway with "database is locked".
    begin_sql = "BEGIN IMMEDIATE"
    # A range of the log is read by rowid range, not by scanning every index entry of
    # the topic (which SQLite prefers when a topic is given; ``ExportStatements``).
    no_index = "+"

    @staticmethod
    def greatest_sql(a: str, b: str) -> str:
        return f"MAX({a}, {b})"  # the scalar max of its arguments

    @staticmethod
    def union_member(select: str) -> str:
        # SQLite allows ORDER BY and LIMIT only at the end of a whole compound SELECT.
        return f"SELECT * FROM ({select})"

    def offset_counter(self) -> Statement:
        # The last offset AUTOINCREMENT handed out.
        return "SELECT seq FROM sqlite_sequence WHERE name = %s", [MESSAGE_TABLE]
