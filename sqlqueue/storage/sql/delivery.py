"""Delivery on a Django connection: fetching messages, marking them delivered,
recording handler outcomes, watermarks, dead letters and replays, and garbage collection.
The statements are built once, in ``sqlqueue.storage.statements`` (``delivery``,
``watermarks``, the vendors' garbage collection); these methods run them and shape the
rows."""

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

#: UNION members of one ``fetch_partitions`` statement (5 parameters each: within
#: SQLite's oldest limit of 999, and a statement of a few dozen KB)
FETCH_PARTITIONS_PER_STATEMENT = 64


class DeliveryAccess(VendorHooks):
    """Mixin for ``Store``: the subscriber's reads and writes of messages and state."""

    # fetch_messages ---------------------------------------------------------------------
    def fetch_messages(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        after: int, limit: int,
    ) -> list[FetchedRow]:
        cursor.execute(*self.sql.fetch_messages(group, topic, partition, after, limit))
        return [self._fetched(r) for r in cursor.fetchall()]

    #: Whether a poll asks first which partitions have new rows (``partitions_with_rows``)
    #: and fetches only those: where a ``fetch_partitions`` of many partitions costs more
    #: than the extra round trip (PostgreSQL: 3-5 ms to plan one of 16; MariaDB 10.11:
    #: 2.3-2.6 ms to run one of 16 at 100 messages/s, against 0.3 ms for the question and
    #: 0.4 ms for the one partition's fetch). SQLite, in-process, has no round trip to save.
    narrows_fetches = False

    def partitions_with_rows(self, cursor: CursorWrapper, topic: str, after: int,
                             upto: int) -> set[str]:
        cursor.execute(*self.sql.partitions_with_rows(topic, after, upto))
        return {str(row[0]) for row in cursor.fetchall()}

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
            self.execute_rows(cursor, *self.sql.fetch_partitions(group, topic, some, limit))
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
        cursor.execute(*self.sql.fetch_messages_at(group, topic, partition, offsets))
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
    def list_offsets(
        self, cursor: CursorWrapper, topic: str, windows: Sequence[tuple[str, int, int]],
        limit: int,
    ) -> dict[str, list[int]]:
        """``partition_offsets``: the offsets stored in each ``(partition, after, upto]``
        window, in order, at most ``limit`` a window (every window's partition is a key,
        empty or not); index-only on ``idx_topic_partition_offset``. Used to find
        late-committed rows."""
        found: dict[str, list[int]] = {partition: [] for partition, _, _ in windows}
        if not windows:
            return found
        cursor.execute(*self.sql.partition_offsets(topic, windows, limit))
        for partition, offset in cursor.fetchall():
            found[partition].append(int(offset))
        for offsets in found.values():
            offsets.sort()  # a UNION promises no order
        return found

    # runs_in_flight --------------------------------------------------------------------
    def runs_in_flight(
        self, cursor: CursorWrapper, group: str, topic: str,
        windows: Sequence[tuple[str, int]],
    ) -> dict[str, int]:
        """``runs_in_flight``: partition -> the latest visibility timeout (database
        ms) of a delivery above its watermark still in flight (or backing off); only the
        partitions that have one."""
        if not windows:
            return {}
        cursor.execute(*self.sql.runs_in_flight(group, topic, windows))
        return {str(partition): int(until) for partition, until in cursor.fetchall()}

    # head_offset -----------------------------------------------------------------------
    def head_offset(self, cursor: CursorWrapper) -> int:
        """``head_offset``: the newest offset of the whole log (primary key, O(1))."""
        return self.head_and_server(cursor)[0]

    def head_and_server(self, cursor: CursorWrapper) -> tuple[int, str]:
        """``head_offset``, and which server answered (``server_identity_sql``): a
        subscriber notices a failover or a proxy that moved its connection at no extra
        statement per poll."""
        cursor.execute(*self.sql.head_offset(with_server=self.server_identity_sql))
        row = cursor.fetchone()
        assert row is not None
        return (int(row[0]) if row[0] is not None else 0), str(row[1])

    def server_identity(self, cursor: CursorWrapper) -> str:
        """``server_identity``: which server this connection reaches ('' on SQLite)."""
        cursor.execute(*self.sql.server_identity())
        row = cursor.fetchone()
        assert row is not None
        return str(row[0])

    # discover_partitions ---------------------------------------------------------------
    def discover_partitions(self, cursor: CursorWrapper, topic: str) -> list[str]:
        """``discover_partitions`` (sqlqueue.storage.statements.vendors)."""
        cursor.execute(*self.sql.discover_partitions(topic))
        return [r[0] for r in cursor.fetchall() if r[0] is not None]

    # mark_delivered ---------------------------------------------------------------------
    def mark_delivered(
        self, cursor: CursorWrapper, group: str, topic: str,
        deliveries: Sequence[tuple[str, int, int]],
    ) -> None:
        """``deliveries``: (partition key, offset, invisible_until), any partitions."""
        if deliveries:
            self.execute_rows(cursor, *self.sql.mark_delivered(group, topic, deliveries))

    # write_outcomes --------------------------------------------------------------------
    def write_outcomes(
        self, cursor: CursorWrapper, group: str, topic: str, writes: Sequence[OutcomeWrite]
    ) -> None:
        if writes:
            self.execute_rows(cursor, *self.sql.write_outcomes(group, topic, writes))

    # give_back ---------------------------------------------------------------------------
    def give_back(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        offset: int, previous_retry_count: int | None,
    ) -> None:
        """``give_back``: undo ``mark_delivered`` for a message that never reached a
        handler (graceful shutdown): no attempt charged, visible again at once."""
        cursor.execute(*self.sql.give_back(group, topic, partition, offset,
                                           previous_retry_count))

    # extend_visibility -------------------------------------------------------------------
    def extend_visibility(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, offset: int,
        milliseconds: int,
    ) -> int:
        """``extend_visibility``: invisible for ``milliseconds`` from the database's now;
        returns the number of rows changed (0: already acked or not delivered)."""
        cursor.execute(*self.sql.extend_visibility(group, topic, partition, offset,
                                                   milliseconds))
        return int(cursor.rowcount)

    # offsets (watermarks) ------------------------------------------------------------------
    def ensure_watermark(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str
    ) -> int:
        """``ensure_watermarks``: create the group's offsets row if missing (this is what
        registers the group with garbage collection), then read the watermark."""
        cursor.execute(*self.sql.ensure_watermarks(group, topic, [partition]))
        cursor.execute(*self.sql.group_watermarks(group, topic, [partition]))
        row = cursor.fetchone()
        return int(row[1]) if row else 0

    def start_at_heads(self, cursor: CursorWrapper, group: str, topic: str) -> int:
        """A group with no position on ``topic`` yet starts after the messages stored now
        (``@consumer(start="latest")``): an offsets row at each partition's newest offset
        (``partition_heads``, ``ensure_watermarks``). A group that has a position keeps
        it. Returns how many partitions were placed."""
        cursor.execute(*self.sql.group_watermarks(group, topic))
        if cursor.fetchone() is not None:
            return 0
        cursor.execute(*self.sql.partition_heads(topic))
        heads = {row[0]: int(row[1]) for row in cursor.fetchall() if row[0] is not None}
        for partition, head in sorted(heads.items()):
            cursor.execute(*self.sql.ensure_watermarks(group, topic, [partition], head))
        return len(heads)

    def advance_watermarks(
        self, cursor: CursorWrapper, group: str, topic: str,
        moves: Sequence[tuple[str, int, int | None]],
    ) -> int:
        """``advance_partition_watermarks``: move each ``(partition, upto,
        first_pending)`` watermark forward, never back, and record the first offset above
        it still to finish, if known (a hint for the lag pages, checked before use); one
        statement. Returns how many moved."""
        if not moves:
            return 0
        cursor.execute(*self.sql.advance_partition_watermarks(group, topic, moves))
        return int(cursor.rowcount)

    def delete_states_upto(
        self, cursor: CursorWrapper, group: str, topic: str, limits: Sequence[tuple[str, int]]
    ) -> int:
        """``delete_states_upto``: drop the delivery state each ``(partition, upto)``
        covers (a primary-key range each), in one statement. Run only after the
        watermarks that cover it committed."""
        if not limits:
            return 0
        cursor.execute(*self.sql.delete_states_upto(group, topic, limits))
        return int(cursor.rowcount)

    def topic_watermarks(
        self, cursor: CursorWrapper, topic: str
    ) -> tuple[set[str], dict[str, dict[str, int]]]:
        """``topic_watermarks``: every group known on a topic, and each partition's
        watermarks by group, in one read of ``idx_topic_partition``."""
        cursor.execute(*self.sql.topic_watermarks(topic))
        groups: set[str] = set()
        partitions: dict[str, dict[str, int]] = {}
        for group, partition, watermark in cursor.fetchall():
            groups.add(group)
            partitions.setdefault(partition, {})[group] = int(watermark)
        return groups, partitions

    # dead letters ---------------------------------------------------------------------------
    def insert_dead_letter(
        self, cursor: CursorWrapper, *, dead_letter_topic: str, dead_letter_id: str,
        offset: int, attempts: int, last_error: str, detail: str, group: str,
    ) -> None:
        cursor.execute(*self.sql.insert_dead_letter(
            dead_letter_topic=dead_letter_topic, dead_letter_id=dead_letter_id,
            offset=offset, attempts=attempts, last_error=last_error, detail=detail,
            group=group))

    def insert_replay(
        self, cursor: CursorWrapper, *, dead_letter_offset: int, replay_id: str, detail: str
    ) -> int:
        """``insert_replay``: copy a dead letter back to its original topic, addressed to
        the group that dead-lettered it; returns the new offset."""
        cursor.execute(*self.sql.insert_replay(dead_letter_offset=dead_letter_offset,
                                               replay_id=replay_id, detail=detail))
        return self.last_inserted_offset(cursor)

    # garbage collection -------------------------------------------------------------------
    def delete_messages_upto(
        self, cursor: CursorWrapper, topic: str, partition: str, upto: int, limit: int
    ) -> int:
        """``delete_messages_upto``: garbage-collect the oldest rows of a partition, at most
        ``limit`` per statement (short transactions, short locks)."""
        cursor.execute(*self.sql.delete_messages_upto(topic, partition, upto, limit))
        return int(cursor.rowcount)

    def delete_messages_in_window(
        self, cursor: CursorWrapper, topic: str, after: int, upto: int,
        limits: Sequence[tuple[str, int]],
    ) -> int:
        """``delete_messages_in_window``: garbage-collect the rows of ``topic`` with
        after < offset <= upto, each at or below its partition's limit (``limits``:
        (partition, limit); a partition not named keeps its rows): a primary-key range,
        one statement."""
        if not limits:
            return 0
        cursor.execute(*self.sql.delete_messages_in_window(topic, after, upto, limits))
        return int(cursor.rowcount)
