"""Named statements of reading the queue's tables out whole or by range: the Spark data
source's batch reads and stream planning, and a consumer group's clean-up after a Spark
stream moved its watermarks. Each returns a ``Statement``; the tables are described by
whatever object has the ``ReadTable`` attributes (the data source's ``Table``), so this
module imports neither Django nor Spark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlqueue.storage.statements.tables import MESSAGE_TABLE, STATE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor


class Named(Protocol):
    @property
    def name(self) -> str: ...


class ReadTable(Protocol):
    """What a read needs to know of a table: its name, key order and topic column, and
    whether it is the log's dead letters only."""

    @property
    def db_table(self) -> str: ...

    @property
    def order_by(self) -> tuple[str, ...]: ...

    @property
    def topic_column(self) -> str: ...

    @property
    def dead_letters_only(self) -> bool: ...


class ExportStatements(Vendor):
    """Reads of whole tables and log ranges (a mixin of ``Statements``)."""

    #: written before a filter column to keep the planner off its index (where a range
    #: of the primary key is what bounds the work)
    no_index = ""

    def _filters(self, table: ReadTable, topic: str | None, group: str | None,
                 ) -> tuple[list[str], list[Any]]:
        q = self.quote
        where: list[str] = []
        params: list[Any] = []
        if table.dead_letters_only:
            where.append(self._dead_letter_where())
        if topic is not None:
            where.append(f"{self.no_index}{q(table.topic_column)} = {self.text_mark}")
            params.append(topic)
        if group is not None:
            # A consumer group receives messages for every group ('') and replays
            # addressed to it, never another group's replays.
            where.append(f"{q('consumer_group')} IN ('', {self.text_mark})")
            params.append(group)
        return where, params

    def _dead_letter_where(self) -> str:
        """A row of the log is a dead letter when it names the group that failed it and
        the topic it came from (the same rule as sqlqueue.models.IS_DEAD_LETTER)."""
        return f"{self.quote('consumer_group')} <> '' AND {self.quote('original_topic')} <> ''"

    def _columns(self, columns: Sequence[Named]) -> str:
        return self.names([c.name for c in columns])

    def log_bounds(self, table: ReadTable, topic: str | None) -> Statement:
        """``log_bounds``: the lowest and highest offset (of a topic): the primary key
        without a topic, a range of ``idx_topic_partition_offset`` with one."""
        where, params = self._filters(table, topic, None)
        offset = self.quote("offset")
        sql = f"SELECT MIN({offset}), MAX({offset}) FROM {self.quote(MESSAGE_TABLE)}"
        return sql + (f" WHERE {' AND '.join(where)}" if where else ""), params

    def rows_in_range(self, table: ReadTable, columns: Sequence[Named], lo: int, hi: int,
                      topic: str | None = None, group: str | None = None) -> Statement:
        """``rows_in_range``: rows of the log with lo <= offset < hi, in offset order (a
        primary-key range)."""
        where, params = self._filters(table, topic, group)
        offset = self.quote("offset")
        return (
            f"SELECT {self._columns(columns)} FROM {self.quote(MESSAGE_TABLE)} "
            f"WHERE {offset} >= %s AND {offset} < %s"
            + "".join(f" AND {w}" for w in where) + f" ORDER BY {offset}",
            [lo, hi, *params],
        )

    def table_rows(self, table: ReadTable, columns: Sequence[Named],
                   topic: str | None = None) -> Statement:
        """``table_rows``: a small table whole (of a topic), in primary-key order."""
        where, params = self._filters(table, topic, None)
        return (
            f"SELECT {self._columns(columns)} FROM {self.quote(table.db_table)}"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY {self.names(table.order_by)}",
            params,
        )

    def partition_states(self, columns: Sequence[Named], group: str, topic: str,
                         partition: str, after: int, upto: int) -> Statement:
        """``partition_states``: a group's delivery state of one partition's offsets in
        (after, upto] (a primary-key range)."""
        q = self.quote
        return (
            f"SELECT {self._columns(columns)} FROM {q(STATE_TABLE)} "
            f"WHERE {q('consumer_group')} = {self.text_mark} AND {q('topic')} = {self.text_mark} "
            f"AND {q('partition_key')} = {self.text_mark} AND {q('message_offset')} > %s AND "
            f"{q('message_offset')} <= %s ORDER BY {q('message_offset')}",
            [group, topic, partition, after, upto],
        )

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

    def drop_open_states(self, group: str, topic: str, upto: int) -> Statement:
        """``drop_open_states``: forget unfinished delivery state (attempts of an earlier
        ``runconsumer``) the group's watermarks now cover; acked rows are history the
        analytics report reads, and stay."""
        q = self.quote
        return (
            f"DELETE FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = {self.text_mark} AND "
            f"{q('topic')} = {self.text_mark} AND {q('message_offset')} <= %s "
            f"AND NOT {q('acked')}",
            [group, topic, upto],
        )
