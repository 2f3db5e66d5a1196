"""Named statements of delivery: a subscriber's reads of a partition (messages with its
group's state, offsets, the head of the log) and its writes of delivery state (marking
messages delivered, handler outcomes, giving back, extending visibility); dead letters
are ``dead_letters``'. Each returns a ``Statement``; ``sqlqueue.storage.sql.delivery``
runs them on a Django connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlqueue.storage.statements.tables import (
    MESSAGE_TABLE,
    STATE_KEY,
    STATE_TABLE,
)
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the columns ``fetch_messages`` reads of a message row, before the state's three
FETCH_COLUMNS = (
    "offset", "id", "payload", "metadata", "created_at", "published_at", "priority",
    "deliver_after", "consumer_group", "failure_detail",
)

@dataclass(frozen=True, slots=True)
class OutcomeWrite:
    """The new delivery state of one message after its handler ran."""

    partition_key: str
    offset: int
    acked: bool
    invisible_until: int
    last_error: str = ""


class DeliveryStatements(Vendor):
    """A subscriber's reads and writes of messages and delivery state (a mixin of
    ``Statements``)."""

    # reads ---------------------------------------------------------------------------------
    def _fetch_sql(self, where: str, *, with_partition: bool = False,
                   after: bool = False) -> str:
        """The log's rows by ``idx_topic_partition_offset``, named on the vendors that take
        a hint: MariaDB, its statistics taken beside a backlog of another topic, read a
        partition by ``idx_topic_partition_id`` and sorted it whole for every fetch (a
        drain of 100,000 messages beside 2 million: 0.19x its rate on an empty log).
        ``after``: the rows read are above an offset (the first parameter after the
        group, then again in ``where``). The state's side of the join is bounded by it
        too: a tautology, given the join on the offset, that keeps its index range to the
        partition's rows above the cursor whichever plan the planner picks. (PostgreSQL,
        its statistics taken while the state table was nearly empty, joined on the first
        three columns of the key alone and filtered the offset: every fetched row read
        every state row of its partition, 100 ms a fetch in a 20,000-message drain.)"""
        q = self.quote
        partition = f", m.{q('partition_key')}" if with_partition else ""
        bound = f"AND s.{q('message_offset')} > %s " if after else ""
        return (
            f"SELECT {self.names(FETCH_COLUMNS, 'm.')}, s.{q('acked')}, "
            f"s.{q('invisible_until')}, s.{q('retry_count')}{partition} "
            f"FROM {q(MESSAGE_TABLE)} m {self.offset_index_hint} LEFT JOIN {q(STATE_TABLE)} s "
            f"ON s.{q('consumer_group')} = {self.text_mark} AND s.{q('topic')} = m.{q('topic')} "
            f"AND s.{q('partition_key')} = m.{q('partition_key')} "
            f"AND s.{q('message_offset')} = m.{q('offset')} {bound}"
            f"WHERE m.{q('topic')} = {self.text_mark} "
            f"AND m.{q('partition_key')} = {self.text_mark} AND {where} "
            f"ORDER BY m.{q('offset')}"
        )

    def fetch_messages(self, group: str, topic: str, partition: str, after: int,
                       limit: int) -> Statement:
        """``fetch_messages``: the next rows of a partition above an offset, with this
        group's state (``FETCH_COLUMNS``, then acked, invisible_until, retry_count); a
        range on ``idx_topic_partition_offset``, then primary-key lookups (message row,
        delivery state)."""
        return (self._fetch_sql(f"m.{self.quote('offset')} > %s", after=True) + " LIMIT %s",
                [group, after, topic, partition, after, limit])

    def fetch_partitions(self, group: str, topic: str, positions: Sequence[tuple[str, int]],
                         limit: int) -> Statement:
        """``fetch_partitions``: ``fetch_messages`` of several (partition, after) in one
        statement (at least one), each its own range of ``idx_topic_partition_offset``
        with its own limit (a UNION ALL), the partition key last. One round trip where a
        poll after new rows in one partition of many would make one per partition."""
        params: list[Any] = []
        for partition, after in positions:
            params += [group, after, topic, partition, after, limit]
        return self._fetch_partitions_sql(len(positions)), params

    def _fetch_partitions_sql(self, members: int) -> str:
        """The text of ``fetch_partitions`` for ``members`` partitions, built once per count
        (a runner's passes ask for the same few counts, each pass)."""
        texts: dict[int, str] = self.__dict__.setdefault("_fetch_partitions_texts", {})
        text = texts.get(members)
        if text is None:
            one = self.union_member(self._fetch_sql(
                f"m.{self.quote('offset')} > %s", with_partition=True, after=True)
                + " LIMIT %s")
            text = texts[members] = " UNION ALL ".join([one] * members)
        return text

    def partitions_with_rows(self, topic: str, after: int, upto: int) -> Statement:
        """``partitions_with_rows``: the partitions of ``topic`` with a visible row whose
        offset is in (after, upto]: a range of the primary key, read across topics (the
        caller keeps the range short: the rows published since its last poll)."""
        q = self.quote
        return (f"SELECT DISTINCT {q('partition_key')} FROM {q(MESSAGE_TABLE)} "
                f"WHERE {q('offset')} > %s AND {q('offset')} <= %s "
                f"AND {q('topic')} = {self.text_mark}",
                [after, upto, topic])

    def fetch_messages_at(self, group: str, topic: str, partition: str,
                          offsets: Sequence[int]) -> Statement:
        """``fetch_messages_at``: the same, for given offsets (late commits found by a
        sweep). ``offsets`` must not be empty."""
        return (self._fetch_sql(f"m.{self.quote('offset')} IN ({self.marks(len(offsets))})"),
                [group, topic, partition, *offsets])

    def partition_rows(self, columns: Sequence[str], topic: str, partition: str,
                       after: int, upto: int, limit: int) -> Statement:
        """``partition_rows``: ``columns`` of a partition's rows with after < offset <=
        upto, in offset order, at most ``limit`` (a range of
        ``idx_topic_partition_offset``, named where a hint is taken, as for the fetch;
        index-only for the offsets alone, which is how
        ``list_offsets`` finds late-committed rows)."""
        q = self.quote
        return (
            f"SELECT {self.names(columns)} FROM {q(MESSAGE_TABLE)} {self.offset_index_hint} "
            f"WHERE {q('topic')} = {self.text_mark} AND {q('partition_key')} = {self.text_mark} "
            f"AND {q('offset')} > %s AND {q('offset')} <= %s "
            f"ORDER BY {q('offset')} LIMIT %s",
            [topic, partition, after, upto, limit],
        )

    def partition_offsets(self, topic: str, windows: Sequence[tuple[str, int, int]],
                          limit: int) -> Statement:
        """``partition_offsets``: ``partition_rows`` of (partition, offset) for each
        ``(partition, after, upto)`` window (at least one), each its own index-only range
        with its own limit, in a UNION ALL: how a watermark's sweep finds late-committed
        rows, one round trip for every partition whose watermark a pass moves."""
        members = [self.partition_rows(("partition_key", "offset"), topic, partition, after,
                                       upto, limit) for partition, after, upto in windows]
        return (" UNION ALL ".join(self.union_member(sql) for sql, _ in members),
                [value for _, params in members for value in params])

    def runs_in_flight(self, group: str, topic: str,
                       windows: Sequence[tuple[str, int]]) -> Statement:
        """``runs_in_flight``: for each ``(partition, watermark)`` (at least one), the
        latest visibility timeout of this group's deliveries above the watermark that are
        not acked and not yet visible again (database time), as (partition, until); a
        partition with none has no row. How a new holder of an ordered partition learns
        that a run made under an earlier lease (a frozen or cut-off holder's) may still
        be going (guarantee I5). A retry's backoff counts too (its row looks the same):
        at worst a late message waits for it. Each window its own range of the state
        table's primary key, in a UNION ALL."""
        q = self.quote
        # text_mark: on MySQL/MariaDB a parameter in the connection's collation is no
        # constant prefix of the binary key, and the GROUP BY of the partition then
        # sorted the window in a temporary table (issue 52's plan tests).
        text = self.text_mark
        one = (f"SELECT {q('partition_key')}, MAX({q('invisible_until')}) "
               f"FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = {text} "
               f"AND {q('topic')} = {text} AND {q('partition_key')} = {text} "
               f"AND {q('message_offset')} > %s AND NOT {q('acked')} "
               f"AND {q('invisible_until')} > {self.now_ms_sql} "
               f"GROUP BY {q('partition_key')}")
        params: list[Any] = []
        for partition, watermark in windows:
            params += [group, topic, partition, watermark]
        return " UNION ALL ".join([self.union_member(one)] * len(windows)), params

    def head_offset(self, with_server: str = "") -> Statement:
        """``head_offset``: the newest offset of the whole log (primary key, O(1)); NULL
        while the log is empty. ``with_server``: an expression of which server answered,
        read as a second column (a subscriber notices a failover at no extra statement)."""
        q = self.quote
        return (f"SELECT MAX({q('offset')})" + (f", {with_server}" if with_server else "")
                + f" FROM {q(MESSAGE_TABLE)}", [])

    def server_identity(self) -> Statement:
        """``server_identity``: which database server answers (``server_identity_sql``),
        read inside an atomic handler's transaction before its ack (guarantee I16)."""
        return f"SELECT {self.server_identity_sql}", []

    # writes --------------------------------------------------------------------------------
    def mark_delivered(self, group: str, topic: str,
                       deliveries: Sequence[tuple[str, int, int]]) -> Statement:
        """``mark_delivered``: start the visibility clock and charge an attempt, for many
        messages in one statement (``deliveries``: (partition key, offset,
        invisible_until), any partitions, at least one). An acked row is never touched; a
        redelivery adds one to ``retry_count`` (the first delivery creates the row with
        0)."""
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "retry_count")
        # ``acked`` is tested and written as a truth value (FALSE, NOT acked), never
        # compared with 0 or 1: a BOOLEAN on PostgreSQL, an integer elsewhere.
        values = ", ".join(["(%s, %s, %s, %s, FALSE, %s, 0)"] * len(deliveries))
        params: list[Any] = []
        for partition, offset, invisible_until in deliveries:
            params += [group, topic, partition, offset, invisible_until]
        return (f"INSERT INTO {q(STATE_TABLE)} ({self.names(columns)}) VALUES {values} "
                f"{self._mark_delivered_clause}", params)

    # Built once (cached_property): it depends on the vendor alone, and every pass of a
    # runner writes marks and outcomes.
    @cached_property
    def _mark_delivered_clause(self) -> str:
        q = self.quote
        return self.upsert_clause(STATE_KEY, {
            # Reads only columns this statement does not assign: order-independent.
            "retry_count": f"CASE WHEN {q('acked')} THEN {q('retry_count')} "
                           f"ELSE {q('retry_count')} + 1 END",
            "invisible_until": f"CASE WHEN {q('acked')} THEN {q('invisible_until')} "
                               f"ELSE {{new}}({q('invisible_until')}) END",
        }, table=STATE_TABLE)

    def write_outcomes(self, group: str, topic: str,
                       writes: Sequence[OutcomeWrite]) -> Statement:
        """``write_outcomes``: record handler outcomes (acks and scheduled retries) for
        many messages in one statement (at least one); an acked row stays acked."""
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "acked_at", "last_error")
        one = f"(%s, %s, %s, %s, %s, %s, CASE WHEN %s THEN {self.now_ms_sql} ELSE 0 END, %s)"
        params: list[Any] = []
        for s in writes:
            params += [group, topic, s.partition_key, s.offset, s.acked, s.invisible_until,
                       s.acked, s.last_error]
        return (f"INSERT INTO {q(STATE_TABLE)} ({self.names(columns)}) "
                f"VALUES {', '.join([one] * len(writes))} {self._write_outcomes_clause}",
                params)

    @cached_property
    def _write_outcomes_clause(self) -> str:
        q = self.quote
        return self.upsert_clause(STATE_KEY, {
            "acked_at": f"CASE WHEN {q('acked')} THEN {q('acked_at')} "
                        f"ELSE {{new}}({q('acked_at')}) END",
            "invisible_until": f"CASE WHEN {q('acked')} THEN {q('invisible_until')} "
                               f"ELSE {{new}}({q('invisible_until')}) END",
            "last_error": f"CASE WHEN {q('acked')} THEN {q('last_error')} "
                          f"ELSE {{new}}({q('last_error')}) END",
            # Assigned last: MySQL evaluates left to right, and the lines above must read
            # the old value.
            "acked": f"{q('acked')} OR {{new}}({q('acked')})",
        }, table=STATE_TABLE)

    def ack_deliveries(self, group: str, topic: str,
                       deliveries: Sequence[tuple[str, int, int]]) -> Statement:
        """``ack_deliveries``: an atomic handler's acks, each fenced on its delivery
        (``deliveries``: (partition, offset, retry_count as its mark left it), at least
        one): a row is acked only if no later delivery charged an attempt since (an
        acked row stays as it was). The caller compares the rows matched with the rows
        given: a later delivery's dead letter and this commit never both win. Each a
        primary-key lookup."""
        q = self.quote
        terms = " OR ".join([f"({q('partition_key')} = {self.text_mark} "
                             f"AND {q('message_offset')} = %s "
                             f"AND {q('retry_count')} = %s)"] * len(deliveries))
        # ``acked`` assigned last: MySQL evaluates left to right, and the others read it.
        keep = [f"{q(c)} = CASE WHEN {q('acked')} THEN {q(c)} ELSE {v} END"
                for c, v in (("acked_at", self.now_ms_sql), ("invisible_until", "0"),
                             ("last_error", "''"))]
        return (f"UPDATE {q(STATE_TABLE)} SET {', '.join(keep)}, {q('acked')} = TRUE "
                f"WHERE {q('consumer_group')} = {self.text_mark} "
                f"AND {q('topic')} = {self.text_mark} AND ({terms})",
                [group, topic, *(v for delivery in deliveries for v in delivery)])

    def _state_key_sql(self) -> str:
        # The key's text columns, then its offset (an integer).
        return " AND ".join(
            f"{self.quote(c)} = {'%s' if c == 'message_offset' else self.text_mark}"
            for c in STATE_KEY)

    def give_back(self, group: str, topic: str, keys: Sequence[tuple[str, int]],
                  previous_retry_count: int | None) -> Statement:
        """``give_back``: undo ``mark_delivered`` for messages that never reached a
        handler (graceful shutdown): no attempt charged, visible again at once (the rows
        go if that was their first delivery). ``keys``: (partition, offset), at least
        one, each a primary-key lookup (the group's and topic's prefix, then an OR of the
        rest); ``previous_retry_count``: the same for all."""
        q = self.quote
        each = (f"({q('partition_key')} = {self.text_mark} "
                f"AND {q('message_offset')} = %s)")
        params: list[Any] = [group, topic]
        for partition, offset in keys:
            params += [partition, offset]
        where = (f"WHERE {q('consumer_group')} = {self.text_mark} "
                 f"AND {q('topic')} = {self.text_mark} "
                 f"AND ({' OR '.join([each] * len(keys))}) AND NOT {q('acked')}")
        if previous_retry_count is None:
            return f"DELETE FROM {q(STATE_TABLE)} {where}", params
        return (f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = 0, "
                f"{q('retry_count')} = %s {where}", [previous_retry_count, *params])

    def extend_visibility(self, group: str, topic: str, partition: str, offset: int,
                          milliseconds: int) -> Statement:
        """``extend_visibility``: invisible for ``milliseconds`` from the database's now
        (no row changes: already acked or not delivered)."""
        q = self.quote
        return (
            f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = {self.now_ms_sql} + %s "
            f"WHERE {self._state_key_sql()} AND NOT {q('acked')}",
            [milliseconds, group, topic, partition, offset],
        )

    def restamp_visibility(self, group: str, topic: str, pairs: Sequence[tuple[str, int]],
                           milliseconds: int) -> Statement:
        """``restamp_visibility``: ``extend_visibility`` for many (partition, offset) pairs
        (at least one) in one statement: a mark that waited for a lock stamps its rows
        again (each a primary-key lookup; acked rows untouched)."""
        q = self.quote
        terms = " OR ".join([f"({q('partition_key')} = {self.text_mark} "
                             f"AND {q('message_offset')} = %s)"] * len(pairs))
        return (f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = {self.now_ms_sql} + %s "
                f"WHERE {q('consumer_group')} = {self.text_mark} "
                f"AND {q('topic')} = {self.text_mark} AND ({terms}) AND NOT {q('acked')}",
                [milliseconds, group, topic, *(v for pair in pairs for v in pair)])


def text_array(values: Sequence[str]) -> str:
    """A PostgreSQL array literal of ``values``, every element quoted (a list parameter
    made psycopg dump and regex-test each element in Python: ~17 ms of a 1,000-row mark's
    main thread; this, a few hundred microseconds)."""
    quoted: dict[str, str] = {}  # partition keys repeat on every row
    for value in values:
        if value not in quoted:
            quoted[value] = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join([quoted[value] for value in values]) + "}"


def number_array(values: Sequence[int]) -> str:
    """A PostgreSQL array literal of whole numbers (see ``text_array``)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


class PostgreSQLDelivery(DeliveryStatements):
    """PostgreSQL's many-row delivery writes (a mixin of ``PostgreSQLStatements``): the
    values of every row travel as one array per column, read back with ``unnest``. The
    statement's text is the same for any number of rows: planned in a fraction of a
    millisecond (a VALUES list of 1,000 rows took the planner 9 ms) and sent without
    psycopg formatting one placeholder per value (it spent more than the server did)."""

    def mark_delivered(self, group: str, topic: str,
                       deliveries: Sequence[tuple[str, int, int]]) -> Statement:
        partitions, offsets, invisible = zip(*deliveries, strict=True)
        return (self._mark_delivered_sql,
                [group, topic, text_array(partitions), number_array(offsets),
                 number_array(invisible)])

    @cached_property
    def _mark_delivered_sql(self) -> str:
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "retry_count")
        return (f"INSERT INTO {q(STATE_TABLE)} ({self.names(columns)}) "
                f"SELECT %s, %s, d.p, d.o, FALSE, d.i, 0 "
                f"FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS d(p, o, i) "
                f"{self._mark_delivered_clause}")

    def restamp_visibility(self, group: str, topic: str, pairs: Sequence[tuple[str, int]],
                           milliseconds: int) -> Statement:
        q = self.quote
        return (f"UPDATE {q(STATE_TABLE)} AS s "
                f"SET {q('invisible_until')} = {self.now_ms_sql} + %s "
                f"FROM unnest(%s::text[], %s::bigint[]) AS d(p, o) "
                f"WHERE s.{q('consumer_group')} = %s AND s.{q('topic')} = %s "
                f"AND s.{q('partition_key')} = d.p AND s.{q('message_offset')} = d.o "
                f"AND NOT s.{q('acked')}",
                [milliseconds, text_array([p for p, _ in pairs]),
                 number_array([o for _, o in pairs]), group, topic])

    def write_outcomes(self, group: str, topic: str,
                       writes: Sequence[OutcomeWrite]) -> Statement:
        return (self._write_outcomes_sql,
                [group, topic, text_array([s.partition_key for s in writes]),
                 number_array([s.offset for s in writes]),
                 "{" + ",".join(["t" if s.acked else "f" for s in writes]) + "}",
                 number_array([s.invisible_until for s in writes]),
                 text_array([s.last_error for s in writes])])

    @cached_property
    def _write_outcomes_sql(self) -> str:
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "acked_at", "last_error")
        return (f"INSERT INTO {q(STATE_TABLE)} ({self.names(columns)}) "
                f"SELECT %s, %s, w.p, w.o, w.a, w.i, "
                f"CASE WHEN w.a THEN {self.now_ms_sql} ELSE 0 END, w.e "
                f"FROM unnest(%s::text[], %s::bigint[], %s::boolean[], %s::bigint[], "
                f"%s::text[]) AS w(p, o, a, i, e) {self._write_outcomes_clause}")
