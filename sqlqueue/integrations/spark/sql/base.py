"""Statement shapes of the data source shared by the vendors; ``mysql.py`` and
``sqlite.py`` fill in the rest.

The statements every executor runs (membership, watermarks, the head of the log, a
partition's rows, the offsets of stored keys, partition discovery, the write horizon, the
vendors' upserts) come from the shared,
Django-free layer (``sqlqueue.storage.statements``); what only the data source reads and
writes is built here. Every method is a named statement (the name is what tests and docs
refer to) returning ``(sql, params)``. Identifiers are always quoted: ``offset`` is
reserved in MariaDB.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlqueue.integrations.spark.tables import Column, Table
from sqlqueue.storage.statements import Statement
from sqlqueue.storage.statements import Statements as SharedStatements
from sqlqueue.storage.statements.tables import (
    MESSAGE_KEY,
    MESSAGE_TABLE,
    STATE_TABLE,
)

#: A dead letter names the group that failed it and the topic it came from (the same
#: rule as sqlqueue.models.IS_DEAD_LETTER).
DEAD_LETTER_SQL = "{q_group} <> '' AND {q_original} <> ''"
#: The columns a published row sets; created_at comes from the database clock.
INSERT_COLUMNS = ("topic", "partition_key", "id", "payload", "metadata", "published_at",
                  "priority", "deliver_after")


class Statements(SharedStatements):
    placeholder = "%s"
    begin_sql = "BEGIN"
    #: begins a transaction that the database lists among the open ones at once (where
    #: ``write_horizon`` is not None)
    begin_snapshot_sql = ""
    #: written before a filter column to keep the planner off its index (where a range
    #: of the primary key is what bounds the work)
    no_index = ""

    # -- reading -----------------------------------------------------------------------
    def _filters(self, table: Table, topic: str | None, group: str | None,
                 ) -> tuple[list[str], list[Any]]:
        q = self.quote
        where: list[str] = []
        params: list[Any] = []
        if table.option == "dead_letters":
            where.append(DEAD_LETTER_SQL.format(q_group=q("consumer_group"),
                                                q_original=q("original_topic")))
        if topic is not None:
            where.append(f"{self.no_index}{q(table.topic_column)} = %s")
            params.append(topic)
        if group is not None:
            # A consumer group receives messages for every group ('') and replays
            # addressed to it, never another group's replays.
            where.append(f"{q('consumer_group')} IN ('', %s)")
            params.append(group)
        return where, params

    def log_bounds(self, table: Table, topic: str | None) -> Statement:
        """``log_bounds``: the lowest and highest offset (of a topic): the primary key
        without a topic, a range of ``idx_topic_partition_offset`` with one."""
        where, params = self._filters(table, topic, None)
        offset = self.quote("offset")
        sql = f"SELECT MIN({offset}), MAX({offset}) FROM {self.quote(MESSAGE_TABLE)}"
        return sql + (f" WHERE {' AND '.join(where)}" if where else ""), params

    def rows_in_range(self, table: Table, columns: Sequence[Column], lo: int, hi: int,
                      topic: str | None = None, group: str | None = None) -> Statement:
        """``rows_in_range``: rows of the log with lo <= offset < hi, in offset order (a
        primary-key range)."""
        where, params = self._filters(table, topic, group)
        offset = self.quote("offset")
        return (
            f"SELECT {self.names([c.name for c in columns])} FROM {self.quote(MESSAGE_TABLE)} "
            f"WHERE {offset} >= %s AND {offset} < %s"
            + "".join(f" AND {w}" for w in where) + f" ORDER BY {offset}",
            [lo, hi, *params],
        )

    def table_rows(self, table: Table, columns: Sequence[Column],
                   topic: str | None = None) -> Statement:
        """``table_rows``: a small table whole (of a topic), in primary-key order."""
        where, params = self._filters(table, topic, None)
        return (
            f"SELECT {self.names([c.name for c in columns])} FROM {self.quote(table.db_table)}"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY {self.names(table.order_by)}",
            params,
        )

    def partition_states(self, columns: Sequence[Column], group: str, topic: str,
                         partition: str, after: int, upto: int) -> Statement:
        """``partition_states``: a group's delivery state of one partition's offsets in
        (after, upto] (a primary-key range)."""
        q = self.quote
        return (
            f"SELECT {self.names([c.name for c in columns])} FROM {q(STATE_TABLE)} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND "
            f"{q('partition_key')} = %s AND {q('message_offset')} > %s AND "
            f"{q('message_offset')} <= %s ORDER BY {q('message_offset')}",
            [group, topic, partition, after, upto],
        )

    # -- the stream's planning -------------------------------------------------------------
    def created_at_of(self, offset: int) -> Statement:
        """``created_at_of``: when a row was inserted (primary-key lookup)."""
        q = self.quote
        return (f"SELECT {q('created_at')} FROM {q(MESSAGE_TABLE)} WHERE {q('offset')} = %s",
                [offset])

    def offsets_from(self, start: int, limit: int) -> Statement:
        """``offsets_from``: offsets and insert times from ``start`` on, in order, at
        most ``limit`` (a primary-key range)."""
        q = self.quote
        return (
            f"SELECT {q('offset')}, {q('created_at')} FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('offset')} >= %s ORDER BY {q('offset')} LIMIT %s",
            [start, limit],
        )

    # -- publishing ------------------------------------------------------------------------
    def insert_messages(self, topic: str, rows: Sequence[Sequence[Any]]) -> Statement:
        """``insert_messages``: a multi-row INSERT that skips rows whose (topic,
        partition_key, id) is stored (idempotent publish: a retried Spark task inserts
        nothing twice). ``rows``: (partition_key, id, payload (str), metadata,
        published_at, priority, deliver_after)."""
        one = f"(%s, %s, %s, %s, %s, %s, %s, %s, {self.message_clock_sql})"
        params: list[Any] = []
        for partition_key, message_id, payload, *rest in rows:
            # Bytes: SQLite would store a str in the BLOB column as TEXT.
            params += [topic, partition_key, message_id, payload.encode("utf-8"), *rest]
        return (
            f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(INSERT_COLUMNS)}, "
            f"{self.quote('created_at')}) VALUES {', '.join([one] * len(rows))} "
            + self.insert_if_absent_suffix(MESSAGE_KEY),
            params,
        )

    def load_messages(self, path: str, topic: str) -> Statement:
        """``load_messages``: bulk-load a CSV file (MySQL/MariaDB only)."""
        raise NotImplementedError(f"{self.vendor} has no LOAD DATA")

    # -- a consumer group's position (its watermarks: the shared layer's) -------------------
    def drop_open_states(self, group: str, topic: str, upto: int) -> Statement:
        """``drop_open_states``: forget unfinished delivery state (attempts of an earlier
        ``runconsumer``) the group's watermarks now cover; acked rows are history the
        analytics report reads, and stay."""
        q = self.quote
        return (
            f"DELETE FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('message_offset')} <= %s AND NOT {q('acked')}",
            [group, topic, upto],
        )
