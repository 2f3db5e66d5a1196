"""Named statements the operator's pages and commands read (lag, metrics, health):
every one bounded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.statements import Statements
from sqlqueue.storage.statements.tables import (
    MESSAGE_TABLE,
    STATE_TABLE,
)

# =========================================================================================
# Operating: what the lag dashboard and ``manage.py queue status`` read. Every statement
# is bounded: one seek per partition, or a scan cut at a cap.
# =========================================================================================

#: SQLite refuses compound SELECTs of more than 500 terms; stay well below.
PENDING_BRANCHES_PER_STATEMENT = 200
#: offsets one primary-key lookup names (below the 999 variables of old SQLite builds)
DUES_PER_STATEMENT = 500


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """Messages of one partition above a watermark: how many (counted up to a cap; None
    when not counted) and since when the first of them is due: stored, and past its
    ``deliver_after`` (None: there are none)."""

    count: int | None
    oldest_due_at: int | None


class OperatingStatements:
    """Mixin for ``Dialect``: the operator's reads."""

    quote: Any
    sql: Statements
    #: makes the per-partition probes use idx_topic_partition_offset without weighing
    #: the other indexes first: planning, not reading, is what they cost otherwise
    offset_index_hint = ""

    def greatest_sql(self, a: str, b: str) -> str:
        raise NotImplementedError

    def partition_heads(self, cursor: CursorWrapper, topic: str) -> dict[str, int]:
        """``partition_heads`` (sqlqueue.storage.statements.vendors): partition -> newest
        offset."""
        cursor.execute(*self.sql.partition_heads(topic))
        return {r[0]: int(r[1]) for r in cursor.fetchall() if r[0] is not None}

    def pending_summary_sql(self, count: int, counted: bool = True) -> str:
        """``pending_summary``: for ``count`` partitions of a topic, the messages above a
        watermark, counted up to a cap (if ``counted``; replays addressed to other groups
        and messages the group acked are counted too: the caller subtracts those), and
        since when the group's first one is due. Each partition is a bounded range of
        ``idx_topic_partition_offset`` (at most ``cap`` index entries) plus primary-key
        lookups of the first rows."""
        q = self.quote
        offset = q("offset")
        above = (f"FROM {q(MESSAGE_TABLE)} {self.offset_index_hint} WHERE {q('topic')} = %s "
                 f"AND {q('partition_key')} = %s AND {offset} > %s")
        # ORDER BY the index's last column: PostgreSQL, which takes no index hint, then
        # reads the range of idx_topic_partition_offset and stops at the cap.
        tally = (f"(SELECT COUNT(*) FROM (SELECT 1 AS one {above} ORDER BY {offset} "
                 f"LIMIT %s) capped)" if counted else "NULL")
        return " UNION ALL ".join([f"SELECT %s, {tally}, {self._first_pending_sql()}"] * count)

    def _first_pending_sql(self) -> str:
        """The due time of the group's first message above a watermark. Skipped: replays
        addressed to other groups, and messages the group acked whose watermark has not
        passed them yet (the write horizon holds it back for a while, also after a
        ``runconsumer --until-empty`` left): both are rare, so this reads one row or a
        few. Parameters: topic, partition key, watermark, group, group."""
        q = self.quote
        m, offset = q("m"), q("offset")
        due = self.greatest_sql(f"{m}.{q('created_at')}", f"{m}.{q('deliver_after')}")
        acked = (f"SELECT 1 FROM {q(STATE_TABLE)} s WHERE s.{q('consumer_group')} = %s "
                 f"AND s.{q('topic')} = {m}.{q('topic')} "
                 f"AND s.{q('partition_key')} = {m}.{q('partition_key')} "
                 f"AND s.{q('message_offset')} = {m}.{offset} AND s.{q('acked')}")
        return (f"(SELECT {due} FROM {q(MESSAGE_TABLE)} {m} {self.offset_index_hint} "
                f"WHERE {m}.{q('topic')} = %s AND {m}.{q('partition_key')} = %s "
                f"AND {m}.{offset} > %s AND {m}.{q('consumer_group')} IN ('', %s) "
                f"AND NOT EXISTS ({acked}) ORDER BY {m}.{offset} LIMIT 1)")

    def pending_summary(
        self, cursor: CursorWrapper, topic: str, group: str, watermarks: dict[str, int],
        cap: int | None,
    ) -> dict[str, PendingSummary]:
        """``watermarks``: partition key -> the offset to count above; ``cap`` None: do
        not count, only find the first pending message."""
        result: dict[str, PendingSummary] = {}
        keys = sorted(watermarks)
        for start in range(0, len(keys), PENDING_BRANCHES_PER_STATEMENT):
            chunk = keys[start:start + PENDING_BRANCHES_PER_STATEMENT]
            params: list[Any] = []
            for key in chunk:
                above = [topic, key, watermarks[key]]
                tally = [*above, cap] if cap is not None else []
                params += [key, *tally, *above, group, group]
            cursor.execute(self.pending_summary_sql(len(chunk), cap is not None), params)
            for key, count, due in cursor.fetchall():
                result[key] = PendingSummary(None if count is None else int(count),
                                             None if due is None else int(due))
        return result

    def first_offsets_above_sql(self, count: int) -> str:
        """``first_offsets_above``: for ``count`` (partition, watermark) pairs of a topic,
        the first stored offset above the watermark, as one row of ``count`` columns. Each
        is a MIN over a range of ``idx_topic_partition_offset`` with constant bounds, which
        both databases answer with one index dive while planning ("Select tables
        optimized away"): the cheapest probe there is, for reads that cover many groups
        at once (the columns of one row cost less to plan than a UNION of as many rows;
        reading the rows themselves is left to ``message_dues``, which costs less than a
        lookup inside each probe)."""
        q = self.quote
        probe = (f"(SELECT MIN({q('offset')}) FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s "
                 f"AND {q('partition_key')} = %s AND {q('offset')} > %s)")
        return "SELECT " + ", ".join([probe] * count)

    def first_offsets_above(
        self, cursor: CursorWrapper, topic: str, pairs: Sequence[tuple[str, int]]
    ) -> list[int | None]:
        """``pairs``: (partition key, watermark); the answers in the same order (None:
        nothing stored above that watermark)."""
        found: list[int | None] = []
        for start in range(0, len(pairs), PENDING_BRANCHES_PER_STATEMENT):
            chunk = pairs[start:start + PENDING_BRANCHES_PER_STATEMENT]
            sql, params = self.first_offsets_above_statement(topic, chunk)
            cursor.execute(sql, params)  # type: ignore[arg-type]  # bytes on MySQL
            found += [None if first is None else int(first) for first in cursor.fetchone()]
        return found

    def first_offsets_above_statement(
        self, topic: str, pairs: Sequence[tuple[str, int]]
    ) -> tuple[str | bytes, list[Any] | None]:
        """``first_offsets_above_sql`` with its parameters (MySQL inlines them)."""
        return (self.first_offsets_above_sql(len(pairs)),
                [value for key, watermark in pairs for value in (topic, key, watermark)])

    def message_dues_sql(self, offsets: Sequence[int]) -> str:
        """``message_dues``: when each message of ``offsets`` is due (stored, and past its
        ``deliver_after``) and which group it is addressed to ('' for every group); by
        primary key. The offsets are written in (integers: nothing to escape): a scrape
        asks for thousands, and binding each costs the driver more than the server."""
        q = self.quote
        due = self.greatest_sql(q("created_at"), q("deliver_after"))
        return (f"SELECT {q('offset')}, {due}, {q('consumer_group')} FROM {q(MESSAGE_TABLE)} "
                f"WHERE {q('offset')} IN ({', '.join(str(int(o)) for o in offsets)})")

    def message_dues(
        self, cursor: CursorWrapper, offsets: Sequence[int]
    ) -> dict[int, tuple[int, str]]:
        result: dict[int, tuple[int, str]] = {}
        for start in range(0, len(offsets), DUES_PER_STATEMENT):
            chunk = list(offsets[start:start + DUES_PER_STATEMENT])
            cursor.execute(self.message_dues_sql(chunk))
            result.update((int(offset), (int(due), group))
                          for offset, due, group in cursor.fetchall())
        return result

    def acked_among_sql(self, count: int) -> str:
        """``acked_among``: which of ``count`` (partition, offset) pairs the group has acked
        (delivery state, by primary key)."""
        q = self.quote
        pairs = " OR ".join([f"({q('partition_key')} = %s AND {q('message_offset')} = %s)"]
                            * count)
        return (f"SELECT {q('partition_key')}, {q('message_offset')} FROM {q(STATE_TABLE)} "
                f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND ({pairs}) "
                f"AND {q('acked')} = %s")

    def acked_among(
        self, cursor: CursorWrapper, group: str, topic: str, pairs: Sequence[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        for start in range(0, len(pairs), DUES_PER_STATEMENT):
            chunk = pairs[start:start + DUES_PER_STATEMENT]
            cursor.execute(self.acked_among_sql(len(chunk)),
                           [group, topic, *(v for pair in chunk for v in pair), True])
            found.update((key, int(offset)) for key, offset in cursor.fetchall())
        return found

    def offset_counter_sql(self) -> str:
        raise NotImplementedError

    def offset_counter(self, cursor: CursorWrapper) -> int | None:
        """``offset_counter``: where the log's offset counter stands (None: unknown). It
        only grows: lower than before means the database lost writes."""
        cursor.execute(self.offset_counter_sql())
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def dead_letter_counts_sql(self) -> str:
        """``dead_letter_counts``: dead letters of one group per partition of a dead-letter
        topic, counted over at most ``cap`` rows (``idx_topic_partition_offset`` range)."""
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, COUNT(*) FROM (SELECT {q('partition_key')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s AND {q('consumer_group')} = %s "
            f"LIMIT %s) capped GROUP BY {q('partition_key')}"
        )

    def dead_letter_counts(
        self, cursor: CursorWrapper, dead_letter_topic: str, group: str, cap: int
    ) -> dict[str, int]:
        cursor.execute(self.dead_letter_counts_sql(), [dead_letter_topic, group, cap])
        return {r[0]: int(r[1]) for r in cursor.fetchall()}
