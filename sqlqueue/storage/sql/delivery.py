"""Delivery on a Django connection: fetching messages, marking them delivered,
recording handler outcomes, the log's head (dead letters: ``dead_letters``). The statements are
built once, in ``sqlqueue.storage.statements.delivery``; these methods run them and shape
the rows."""

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

#: keys of one ``give_back`` statement (2 parameters each: within SQLite's oldest limit)
GIVE_BACKS_PER_STATEMENT = 400

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
        # Positional, in FetchedRow's field order (every fetched row passes here).
        return FetchedRow(
            int(r[0]), r[1], bytes(r[2]), _text(r[3]), int(r[4]), int(r[5]), int(r[6]),
            int(r[7]), r[8], _text(r[9]), None if r[10] is None else bool(r[10]),
            None if r[11] is None else int(r[11]), None if r[12] is None else int(r[12]),
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

    # ack_deliveries ----------------------------------------------------------------------
    def ack_deliveries(
        self, cursor: CursorWrapper, group: str, topic: str,
        deliveries: Sequence[tuple[str, int, int]],
    ) -> int:
        """``ack_deliveries``: (partition, offset, retry_count) each acked only if not
        delivered again since; returns how many rows matched (an acked one too: Django's
        MySQL connections count rows matched, ``CLIENT.FOUND_ROWS``)."""
        if not deliveries:
            return 0
        cursor.execute(*self.sql.ack_deliveries(group, topic, deliveries))
        return int(cursor.rowcount)

    # give_back ---------------------------------------------------------------------------
    def give_back(
        self, cursor: CursorWrapper, group: str, topic: str,
        keys: Sequence[tuple[str, int]], previous_retry_count: int | None,
    ) -> None:
        """``give_back``: undo ``mark_delivered`` for messages (partition, offset) that
        never reached a handler (graceful shutdown): no attempt charged, visible again at
        once; ``GIVE_BACKS_PER_STATEMENT`` a statement."""
        for first in range(0, len(keys), GIVE_BACKS_PER_STATEMENT):
            self.execute_rows(cursor, *self.sql.give_back(
                group, topic, keys[first:first + GIVE_BACKS_PER_STATEMENT],
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

    # restamp_visibility ------------------------------------------------------------------
    def restamp_visibility(
        self, cursor: CursorWrapper, group: str, topic: str,
        pairs: Sequence[tuple[str, int]], milliseconds: int,
    ) -> None:
        """``restamp_visibility``: ``extend_visibility`` of many (partition, offset) pairs,
        in one statement (one per row cost a pass ~1,000 round trips after a slow mark)."""
        if pairs:
            self.execute_rows(cursor, *self.sql.restamp_visibility(group, topic, pairs,
                                                                   milliseconds))
