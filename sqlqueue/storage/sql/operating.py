"""The operator's reads (lag, metrics, health) on a Django connection: every one
bounded. The statements are built once, in ``sqlqueue.storage.statements.operating``
(and the vendors'); these methods cut the work into statements, run them and shape the
rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks

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


class OperatingAccess(VendorHooks):
    """Mixin for ``Dialect``: the operator's reads."""

    def partition_heads(self, cursor: CursorWrapper, topic: str) -> dict[str, int]:
        """``partition_heads`` (sqlqueue.storage.statements.vendors): partition -> newest
        offset."""
        cursor.execute(*self.sql.partition_heads(topic))
        return {r[0]: int(r[1]) for r in cursor.fetchall() if r[0] is not None}

    def pending_summary(
        self, cursor: CursorWrapper, topic: str, group: str, watermarks: dict[str, int],
        cap: int | None,
    ) -> dict[str, PendingSummary]:
        """``watermarks``: partition key -> the offset to count above; ``cap`` None: do
        not count, only find the first pending message."""
        result: dict[str, PendingSummary] = {}
        keys = sorted(watermarks)
        for start in range(0, len(keys), PENDING_BRANCHES_PER_STATEMENT):
            chunk = [(key, watermarks[key])
                     for key in keys[start:start + PENDING_BRANCHES_PER_STATEMENT]]
            cursor.execute(*self.sql.pending_summary(topic, group, chunk, cap))
            for key, count, due in cursor.fetchall():
                result[key] = PendingSummary(None if count is None else int(count),
                                             None if due is None else int(due))
        return result

    def first_offsets_above(
        self, cursor: CursorWrapper, topic: str, pairs: Sequence[tuple[str, int]]
    ) -> list[int | None]:
        """``pairs``: (partition key, watermark); the answers in the same order (None:
        nothing stored above that watermark)."""
        found: list[int | None] = []
        for start in range(0, len(pairs), PENDING_BRANCHES_PER_STATEMENT):
            chunk = pairs[start:start + PENDING_BRANCHES_PER_STATEMENT]
            # Inlined on MySQL (execute_rows): a scrape of many lagging groups sends
            # thousands of probes, and binding three values each cost more than the
            # server's answer.
            self.execute_rows(cursor, *self.sql.first_offsets_above(topic, chunk))
            found += [None if first is None else int(first) for first in cursor.fetchone()]
        return found

    def message_dues(
        self, cursor: CursorWrapper, offsets: Sequence[int]
    ) -> dict[int, tuple[int, str]]:
        result: dict[int, tuple[int, str]] = {}
        for start in range(0, len(offsets), DUES_PER_STATEMENT):
            cursor.execute(*self.sql.message_dues(offsets[start:start + DUES_PER_STATEMENT]))
            result.update((int(offset), (int(due), group))
                          for offset, due, group in cursor.fetchall())
        return result

    def acked_among(
        self, cursor: CursorWrapper, group: str, topic: str, pairs: Sequence[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        for start in range(0, len(pairs), DUES_PER_STATEMENT):
            cursor.execute(*self.sql.acked_among(group, topic,
                                                 pairs[start:start + DUES_PER_STATEMENT]))
            found.update((key, int(offset)) for key, offset in cursor.fetchall())
        return found

    def offset_counter(self, cursor: CursorWrapper) -> int | None:
        """``offset_counter``: where the log's offset counter stands (None: unknown). It
        only grows: lower than before means the database lost writes."""
        cursor.execute(*self.sql.offset_counter())
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def dead_letter_counts(
        self, cursor: CursorWrapper, dead_letter_topic: str, group: str, cap: int
    ) -> dict[str, int]:
        cursor.execute(*self.sql.dead_letter_counts(dead_letter_topic, group, cap))
        return {r[0]: int(r[1]) for r in cursor.fetchall()}

    # -- the admin's log pages (sqlqueue.storage.statements.browse) ----------------------
    def log_topics(self, cursor: CursorWrapper, limit: int) -> list[str]:
        """``log_topics``: the log's topics in order, at most ``limit``."""
        cursor.execute(*self.sql.log_topics(limit))
        return [r[0] for r in cursor.fetchall()]

    def log_partitions(self, cursor: CursorWrapper, limit: int) -> dict[str, list[str]]:
        """``log_partitions``: topic -> its partition keys, at most ``limit`` pairs."""
        cursor.execute(*self.sql.log_partitions(limit))
        found: dict[str, list[str]] = {}
        for topic, key in cursor.fetchall():
            found.setdefault(topic, []).append(key)
        return found

    def newest_of_key(self, cursor: CursorWrapper, topics: Sequence[str], key: str,
                      limit: int) -> list[int]:
        """``newest_of_key`` for any number of topics (a statement per
        ``PENDING_BRANCHES_PER_STATEMENT``)."""
        found: list[int] = []
        for start in range(0, len(topics), PENDING_BRANCHES_PER_STATEMENT):
            cursor.execute(*self.sql.newest_of_key(
                topics[start:start + PENDING_BRANCHES_PER_STATEMENT], key, limit))
            found += [int(r[0]) for r in cursor.fetchall()]
        return found

    def offsets_of_id(self, cursor: CursorWrapper, partitions: dict[str, list[str]],
                      message_id: str) -> list[int]:
        """``offsets_of_id`` for any number of topics and partitions: a statement per
        ``DUES_PER_STATEMENT`` parameters or ``PENDING_BRANCHES_PER_STATEMENT`` topics
        (old SQLite builds take 999 variables and 500 compound terms)."""
        found: list[int] = []
        chunk: list[tuple[str, list[str]]] = []
        size = 0
        for topic, keys in partitions.items():
            for key in keys:
                if size + 3 > DUES_PER_STATEMENT or (
                        len(chunk) == PENDING_BRANCHES_PER_STATEMENT and chunk[-1][0] != topic):
                    cursor.execute(*self.sql.offsets_of_id(chunk, message_id))
                    found += [int(r[0]) for r in cursor.fetchall()]
                    chunk, size = [], 0
                if chunk and chunk[-1][0] == topic:
                    chunk[-1][1].append(key)
                    size += 1
                else:
                    chunk.append((topic, [key]))
                    size += 3
        if chunk:
            cursor.execute(*self.sql.offsets_of_id(chunk, message_id))
            found += [int(r[0]) for r in cursor.fetchall()]
        return found

    def topic_counts(self, cursor: CursorWrapper, topics: Sequence[str],
                     cap: int) -> dict[str, int]:
        """``topic_counts`` for any number of topics (a statement per
        ``PENDING_BRANCHES_PER_STATEMENT``): topic -> messages, counted up to ``cap``."""
        counts: dict[str, int] = {}
        for start in range(0, len(topics), PENDING_BRANCHES_PER_STATEMENT):
            cursor.execute(*self.sql.topic_counts(
                topics[start:start + PENDING_BRANCHES_PER_STATEMENT], cap))
            counts.update((topic, int(count)) for topic, count in cursor.fetchall())
        return counts
