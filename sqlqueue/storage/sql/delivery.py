"""Named statements of delivery: fetching messages, marking them delivered, recording
handler outcomes, watermarks, dead letters and replays, and garbage collection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import (
    FetchedRow,
    OutcomeWrite,
    VendorHooks,
    _text,
)
from sqlqueue.storage.statements.tables import (
    GROUP_KEY,
    MESSAGE_TABLE,
    OFFSETS_TABLE,
    STATE_KEY,
    STATE_TABLE,
)

#: UNION members of one ``fetch_partitions`` statement (5 parameters each: within
#: SQLite's oldest limit of 999, and a statement of a few dozen KB)
FETCH_PARTITIONS_PER_STATEMENT = 64


class DeliveryStatements(VendorHooks):
    """Mixin for ``Dialect``: the subscriber's reads and writes of messages and state."""

    # fetch_messages ---------------------------------------------------------------------
    _FETCH_COLUMNS = (
        "offset", "id", "payload", "metadata", "created_at", "published_at", "priority",
        "deliver_after", "consumer_group", "failure_detail",
    )

    def _fetch_sql(self, where: str, *, with_partition: bool = False) -> str:
        q = self.quote
        columns = ", ".join(f"m.{q(c)}" for c in self._FETCH_COLUMNS)
        partition = f", m.{q('partition_key')}" if with_partition else ""
        return (
            f"SELECT {columns}, s.{q('acked')}, s.{q('invisible_until')}, "
            f"s.{q('retry_count')}{partition} "
            f"FROM {q(MESSAGE_TABLE)} m LEFT JOIN {q(STATE_TABLE)} s "
            f"ON s.{q('consumer_group')} = %s AND s.{q('topic')} = m.{q('topic')} "
            f"AND s.{q('partition_key')} = m.{q('partition_key')} "
            f"AND s.{q('message_offset')} = m.{q('offset')} "
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND {where} "
            f"ORDER BY m.{q('offset')}"
        )

    def fetch_messages_sql(self) -> str:
        """``fetch_messages``: the next rows of a partition above an offset, with this
        group's state; a range on ``idx_topic_partition_offset``, then primary-key
        lookups (message row, delivery state)."""
        return self._fetch_sql(f"m.{self.quote('offset')} > %s") + " LIMIT %s"

    def fetch_messages(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        after: int, limit: int,
    ) -> list[FetchedRow]:
        cursor.execute(self.fetch_messages_sql(), [group, topic, partition, after, limit])
        return [self._fetched(r) for r in cursor.fetchall()]

    def fetch_partitions_sql(self, count: int) -> str:
        """``fetch_partitions``: ``fetch_messages`` of ``count`` partitions in one
        statement, each its own range of ``idx_topic_partition_offset`` with its own
        limit (a UNION ALL), the partition key last. One round trip where a poll after
        new rows in one partition of many would make one per partition."""
        one = self._fetch_sql(f"m.{self.quote('offset')} > %s", with_partition=True)
        return " UNION ALL ".join([self.union_member(one + " LIMIT %s")] * count)

    def union_member(self, select: str) -> str:  # with its own ORDER BY and LIMIT
        return f"({select})"

    def fetch_partitions(
        self, cursor: CursorWrapper, group: str, topic: str,
        positions: Sequence[tuple[str, int]], limit: int,
    ) -> dict[str, list[FetchedRow]]:
        """The next rows above each (partition, offset), at most ``limit`` each."""
        found: dict[str, list[FetchedRow]] = {partition: [] for partition, _ in positions}
        if len(positions) == 1:
            return {p: self.fetch_messages(cursor, group, topic, p, after, limit)
                    for p, after in positions}
        for first in range(0, len(positions), FETCH_PARTITIONS_PER_STATEMENT):
            some = positions[first:first + FETCH_PARTITIONS_PER_STATEMENT]
            params: list[Any] = []
            for partition, after in some:
                params += [group, topic, partition, after, limit]
            self.execute_rows(cursor, self.fetch_partitions_sql(len(some)), params)
            for r in cursor.fetchall():
                found[r[13]].append(self._fetched(r))
        for rows in found.values():
            rows.sort(key=lambda row: row.offset)  # a UNION promises no order
        return found

    def fetch_messages_at(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        offsets: Sequence[int],
    ) -> list[FetchedRow]:
        """``fetch_messages_at``: the same, for given offsets (late commits found by a
        sweep)."""
        if not offsets:
            return []
        marks = ", ".join(["%s"] * len(offsets))
        sql = self._fetch_sql(f"m.{self.quote('offset')} IN ({marks})")
        cursor.execute(sql, [group, topic, partition, *offsets])
        return [self._fetched(r) for r in cursor.fetchall()]

    @staticmethod
    def _fetched(r: Sequence[Any]) -> FetchedRow:
        return FetchedRow(
            offset=int(r[0]), id=r[1], payload=bytes(r[2]), metadata=_text(r[3]),
            created_at=int(r[4]), published_at=int(r[5]), priority=int(r[6]),
            deliver_after=int(r[7]), consumer_group=r[8], failure_detail=_text(r[9]),
            acked=None if r[10] is None else bool(r[10]),
            invisible_until=None if r[11] is None else int(r[11]),
            retry_count=None if r[12] is None else int(r[12]),
        )

    # list_offsets -------------------------------------------------------------------------
    def list_offsets_sql(self) -> str:
        """``list_offsets``: offsets stored in (after, upto] of a partition; index-only on
        ``idx_topic_partition_offset``. Used to find late-committed rows."""
        q = self.quote
        return (
            f"SELECT {q('offset')} FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('offset')} > %s AND {q('offset')} <= %s "
            f"ORDER BY {q('offset')} LIMIT %s"
        )

    def list_offsets(
        self, cursor: CursorWrapper, topic: str, partition: str, after: int, upto: int,
        limit: int,
    ) -> list[int]:
        cursor.execute(self.list_offsets_sql(), [topic, partition, after, upto, limit])
        return [int(r[0]) for r in cursor.fetchall()]

    # head_offset -----------------------------------------------------------------------
    def head_offset(self, cursor: CursorWrapper) -> int:
        """``head_offset``: the newest offset of the whole log (primary key, O(1))."""
        return self.head_and_server(cursor)[0]

    def head_and_server(self, cursor: CursorWrapper) -> tuple[int, str]:
        """``head_offset``, and which server answered (``server_identity_sql``): a
        subscriber notices a failover or a proxy that moved its connection at no extra
        statement per poll."""
        q = self.quote
        cursor.execute(f"SELECT MAX({q('offset')}), {self.server_identity_sql} "
                       f"FROM {q(MESSAGE_TABLE)}")
        row = cursor.fetchone()
        assert row is not None
        return (int(row[0]) if row[0] is not None else 0), str(row[1])

    # discover_partitions ---------------------------------------------------------------
    def discover_partitions(self, cursor: CursorWrapper, topic: str) -> list[str]:
        """``discover_partitions`` (sqlqueue.storage.statements.vendors)."""
        cursor.execute(*self.sql.discover_partitions(topic))
        return [r[0] for r in cursor.fetchall() if r[0] is not None]

    # mark_delivered ---------------------------------------------------------------------
    def mark_delivered_sql(self, count: int) -> str:
        """``mark_delivered``: start the visibility clock and charge an attempt, for many
        messages in one statement. An acked row is never touched; a redelivery adds one
        to ``retry_count`` (the first delivery creates the row with 0)."""
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "retry_count")
        # ``acked`` is tested and written as a truth value (FALSE, NOT acked), never
        # compared with 0 or 1: a BOOLEAN on PostgreSQL, an integer elsewhere.
        values = ", ".join(["(%s, %s, %s, %s, FALSE, %s, 0)"] * count)
        clause = self.upsert_clause(STATE_KEY, {
            # Reads only columns this statement does not assign: order-independent.
            "retry_count": f"CASE WHEN {q('acked')} THEN {q('retry_count')} "
                           f"ELSE {q('retry_count')} + 1 END",
            "invisible_until": f"CASE WHEN {q('acked')} THEN {q('invisible_until')} "
                               f"ELSE {{new}}({q('invisible_until')}) END",
        }, table=STATE_TABLE)
        return (
            f"INSERT INTO {q(STATE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {values} {clause}"
        )

    def mark_delivered(
        self, cursor: CursorWrapper, group: str, topic: str,
        deliveries: Sequence[tuple[str, int, int]],
    ) -> None:
        """``deliveries``: (partition key, offset, invisible_until), any partitions."""
        if not deliveries:
            return
        params: list[Any] = []
        for partition, offset, invisible_until in deliveries:
            params += [group, topic, partition, offset, invisible_until]
        self.execute_rows(cursor, self.mark_delivered_sql(len(deliveries)), params)

    # write_outcomes --------------------------------------------------------------------
    def write_outcomes_sql(self, count: int) -> str:
        """``write_outcomes``: record handler outcomes (acks and scheduled retries) for many
        messages in one statement; an acked row stays acked."""
        q = self.quote
        now = self.now_ms_sql
        columns = (*STATE_KEY, "acked", "invisible_until", "acked_at", "last_error")
        one = f"(%s, %s, %s, %s, %s, %s, CASE WHEN %s THEN {now} ELSE 0 END, %s)"
        clause = self.upsert_clause(STATE_KEY, {
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
        return (
            f"INSERT INTO {q(STATE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {', '.join([one] * count)} {clause}"
        )

    def write_outcomes(
        self, cursor: CursorWrapper, group: str, topic: str, writes: Sequence[OutcomeWrite]
    ) -> None:
        if not writes:
            return
        params: list[Any] = []
        for s in writes:
            params += [group, topic, s.partition_key, s.offset, s.acked, s.invisible_until,
                       s.acked, s.last_error]
        self.execute_rows(cursor, self.write_outcomes_sql(len(writes)), params)

    # give_back ---------------------------------------------------------------------------
    def give_back(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        offset: int, previous_retry_count: int | None,
    ) -> None:
        """``give_back``: undo ``mark_delivered`` for a message that never reached a
        handler (graceful shutdown): no attempt charged, visible again at once."""
        q = self.quote
        key_sql = " AND ".join(f"{q(c)} = %s" for c in STATE_KEY)
        key: list[Any] = [group, topic, partition, offset]
        if previous_retry_count is None:
            cursor.execute(f"DELETE FROM {q(STATE_TABLE)} WHERE {key_sql} AND NOT {q('acked')}",
                           key)
        else:
            cursor.execute(
                f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = 0, "
                f"{q('retry_count')} = %s WHERE {key_sql} AND NOT {q('acked')}",
                [previous_retry_count, *key],
            )

    # extend_visibility -------------------------------------------------------------------
    def extend_visibility(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, offset: int,
        milliseconds: int,
    ) -> int:
        """``extend_visibility``: invisible for ``milliseconds`` from the database's now;
        returns the number of rows changed (0: already acked or not delivered)."""
        q = self.quote
        key_sql = " AND ".join(f"{q(c)} = %s" for c in STATE_KEY)
        cursor.execute(
            f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = {self.now_ms_sql} + %s "
            f"WHERE {key_sql} AND NOT {q('acked')}",
            [milliseconds, group, topic, partition, offset],
        )
        return int(cursor.rowcount)

    # offsets (watermarks) ------------------------------------------------------------------
    def ensure_watermark(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str
    ) -> int:
        """``ensure_watermark``: create the group's offsets row if missing (this is what
        registers the group with garbage collection), then read the watermark."""
        q = self.quote
        columns = (*GROUP_KEY, "offset_acked", "updated_at")
        cursor.execute(
            self.insert_if_absent(OFFSETS_TABLE, columns, GROUP_KEY).format(
                values=f"%s, %s, %s, 0, {self.now_ms_sql}"
            ),
            [group, topic, partition],
        )
        cursor.execute(
            f"SELECT {q('offset_acked')} FROM {q(OFFSETS_TABLE)} WHERE "
            + " AND ".join(f"{q(c)} = %s" for c in GROUP_KEY),
            [group, topic, partition],
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def advance_watermark(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, upto: int,
        first_pending: int | None = None,
    ) -> int:
        """``advance_watermark``: move the watermark forward, never back, and record the
        first offset above it still to finish, if known (``first_pending``: a hint for
        the lag pages, checked before use)."""
        q = self.quote
        cursor.execute(
            f"UPDATE {q(OFFSETS_TABLE)} SET {q('offset_acked')} = %s, "
            f"{q('updated_at')} = {self.now_ms_sql}, {q('first_pending')} = %s WHERE "
            + " AND ".join(f"{q(c)} = %s" for c in GROUP_KEY)
            + f" AND {q('offset_acked')} < %s",
            [upto, first_pending, group, topic, partition, upto],
        )
        return int(cursor.rowcount)

    def delete_states_upto(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, upto: int
    ) -> int:
        """``delete_states_upto``: drop delivery state the watermark covers (primary-key
        range). Run only after ``advance_watermark`` committed."""
        q = self.quote
        cursor.execute(
            f"DELETE FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('partition_key')} = %s AND {q('message_offset')} <= %s",
            [group, topic, partition, upto],
        )
        return int(cursor.rowcount)

    def topic_watermarks(
        self, cursor: CursorWrapper, topic: str
    ) -> tuple[set[str], dict[str, dict[str, int]]]:
        """``topic_watermarks``: every group known on a topic, and each partition's
        watermarks by group, in one read of ``idx_topic_partition``."""
        q = self.quote
        cursor.execute(
            f"SELECT {q('consumer_group')}, {q('partition_key')}, {q('offset_acked')} "
            f"FROM {q(OFFSETS_TABLE)} WHERE {q('topic')} = %s",
            [topic],
        )
        groups: set[str] = set()
        partitions: dict[str, dict[str, int]] = {}
        for group, partition, watermark in cursor.fetchall():
            groups.add(group)
            partitions.setdefault(partition, {})[group] = int(watermark)
        return groups, partitions

    # dead letters ---------------------------------------------------------------------------
    _DEAD_LETTER_COLUMNS = (
        "topic", "partition_key", "id", "payload", "metadata", "created_at", "published_at",
        "failed_at", "failure_count", "last_error", "original_topic", "failure_detail",
        "priority", "consumer_group",
    )

    def insert_dead_letter_sql(self) -> str:
        """``insert_dead_letter``: copy a message into its dead-letter topic for one group
        (payload copied inside the server); dead-lettering it again updates the row."""
        q = self.quote
        now = self.now_ms_sql
        m = "m."
        select = (
            f"SELECT %s, {m}{q('partition_key')}, %s, {m}{q('payload')}, {m}{q('metadata')}, "
            f"{self.message_clock_sql}, {m}{q('published_at')}, {now}, %s, %s, "
            f"{m}{q('topic')}, %s, "
            f"{m}{q('priority')}, %s FROM {q(MESSAGE_TABLE)} m WHERE {m}{q('offset')} = %s"
        )
        clause = self.upsert_clause(("topic", "partition_key", "id"), {
            "failed_at": f"{{new}}({q('failed_at')})",
            "failure_count": f"{{new}}({q('failure_count')})",
            "last_error": f"{{new}}({q('last_error')})",
            "failure_detail": f"{{new}}({q('failure_detail')})",
        }, table=MESSAGE_TABLE)
        columns = ", ".join(q(c) for c in self._DEAD_LETTER_COLUMNS)
        return f"INSERT INTO {q(MESSAGE_TABLE)} ({columns}) {select} {clause}"

    def insert_dead_letter(
        self, cursor: CursorWrapper, *, dead_letter_topic: str, dead_letter_id: str,
        offset: int, attempts: int, last_error: str, detail: str, group: str,
    ) -> None:
        cursor.execute(
            self.insert_dead_letter_sql(),
            [dead_letter_topic, dead_letter_id, attempts, last_error, detail, group, offset],
        )

    def insert_replay(
        self, cursor: CursorWrapper, *, dead_letter_offset: int, replay_id: str, detail: str
    ) -> int:
        """``insert_replay``: copy a dead letter back to its original topic, addressed to
        the group that dead-lettered it; returns the new offset."""
        q = self.quote
        columns = ("topic", "partition_key", "id", "payload", "metadata", "created_at",
                   "published_at", "priority", "consumer_group", "failure_detail")
        cursor.execute(
            f"INSERT INTO {q(MESSAGE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"SELECT {q('original_topic')}, {q('partition_key')}, %s, {q('payload')}, "
            f"{q('metadata')}, {self.message_clock_sql}, {q('published_at')}, "
            f"{q('priority')}, {q('consumer_group')}, %s FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('offset')} = %s{self.returning_offset_sql}",
            [replay_id, detail, dead_letter_offset],
        )
        return self.last_inserted_offset(cursor)

    # garbage collection -------------------------------------------------------------------
    def delete_messages_upto(
        self, cursor: CursorWrapper, topic: str, partition: str, upto: int, limit: int
    ) -> int:
        """``delete_messages_upto``: garbage-collect the oldest rows of a partition, at most
        ``limit`` per statement (short transactions, short locks)."""
        cursor.execute(self.delete_messages_upto_sql(), [topic, partition, upto, limit])
        return int(cursor.rowcount)
