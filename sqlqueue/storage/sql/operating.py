"""The operator's reads (lag, metrics, health) on a Django connection: every one
bounded. The statements are built once, in ``sqlqueue.storage.statements.operating``
these methods cut the work into statements, run them and shape the
rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
    """Mixin for ``Store``: the operator's reads."""

    #: probes one ``pending_where_cheap`` / ``dead_letters_if_few`` statement carries:
    #: SQLite refuses compound SELECTs of more than 500 terms; MySQL/MariaDB parse a UNION
    #: ALL of constant rows quickly (what costs is planning a member that reads a
    #: table); PostgreSQL's travel as arrays
    probes_per_statement = 200

    @contextmanager
    def operator_reads(self, alias: str) -> Iterator[None]:
        """Around the reads of the lag of many subscriptions (PostgreSQL's: without
        JIT compilation)."""
        yield

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

    def pending_summaries(
        self, cursor: CursorWrapper, probes: Sequence[tuple[str, str, str, int]],
        cap: int | None,
    ) -> dict[tuple[str, str, str], PendingSummary]:
        """``probes``: (topic, group, partition key, watermark); the answers by (topic,
        group, partition key): ``pending_summary`` of many topics and groups. The probes
        of small partitions, or of partitions wholly above the watermark, are answered by
        ``pending_where_cheap`` (one statement per ``probes_per_statement``, planned
        once); the others by ``pending_summaries``, a statement per
        ``PENDING_BRANCHES_PER_STATEMENT`` probes."""
        result: dict[tuple[str, str, str], PendingSummary] = {}
        if cap is not None:
            probes = self._pending_of_few(cursor, probes, cap, result)
        for start in range(0, len(probes), PENDING_BRANCHES_PER_STATEMENT):
            cursor.execute(*self.sql.pending_summaries(
                probes[start:start + PENDING_BRANCHES_PER_STATEMENT], cap))
            for topic, group, key, count, due in cursor.fetchall():
                result[topic, group, key] = PendingSummary(
                    None if count is None else int(count), None if due is None else int(due))
        return result

    def _pending_of_few(
        self, cursor: CursorWrapper, probes: Sequence[tuple[str, str, str, int]], cap: int,
        result: dict[tuple[str, str, str], PendingSummary],
    ) -> list[tuple[str, str, str, int]]:
        """``pending_where_cheap`` of ``probes`` into ``result``; the probes it left."""
        left = []
        size = self.probes_per_statement
        for start in range(0, len(probes), size):
            chunk = probes[start:start + size]
            cursor.execute(*self.sql.pending_where_cheap(chunk, cap))
            answered = {int(n): (count, due) for n, count, due in cursor.fetchall()
                        if count is not None}
            for n, (topic, group, key, watermark) in enumerate(chunk):
                if n not in answered:
                    left.append((topic, group, key, watermark))
                    continue
                count, due = answered[n]
                result[topic, group, key] = PendingSummary(
                    int(count), None if due is None else int(due))
        return left

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
        self, cursor: CursorWrapper, group: str, topic: str, pairs: Sequence[tuple[str, int]],
        lock: bool = False,
    ) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        for start in range(0, len(pairs), DUES_PER_STATEMENT):
            cursor.execute(*self.sql.acked_among(
                group, topic, pairs[start:start + DUES_PER_STATEMENT], lock))
            found.update((key, int(offset)) for key, offset in cursor.fetchall())
        return found

    def dead_letter_counts(
        self, cursor: CursorWrapper, dead_letter_topic: str, group: str, cap: int
    ) -> dict[str, int]:
        cursor.execute(*self.sql.dead_letter_counts(dead_letter_topic, group, cap))
        return {r[0]: int(r[1]) for r in cursor.fetchall()}

    def dead_letter_tallies(
        self, cursor: CursorWrapper, pairs: Sequence[tuple[str, str]], cap: int
    ) -> dict[tuple[str, str], dict[str, int]]:
        """``pairs``: (dead-letter topic, group); (topic, group) -> partition -> dead
        letters (counted over at most ``cap`` rows a pair). A pair without any has no
        entry. The pairs with fewer than ``cap``: ``dead_letters_if_few``, one
        statement per ``probes_per_statement``; the others a statement per
        ``PENDING_BRANCHES_PER_STATEMENT`` pairs."""
        found: dict[tuple[str, str], dict[str, int]] = {}
        many = []
        size = self.probes_per_statement
        for first in range(0, len(pairs), size):
            chunk = pairs[first:first + size]
            cursor.execute(*self.sql.dead_letters_if_few(chunk, cap))
            for n, key, count in cursor.fetchall():
                if key is None:
                    many.append(chunk[int(n)])
                else:
                    found.setdefault(chunk[int(n)], {})[key] = int(count)
        pairs = many
        for start in range(0, len(pairs), PENDING_BRANCHES_PER_STATEMENT):
            cursor.execute(*self.sql.dead_letter_tallies(
                pairs[start:start + PENDING_BRANCHES_PER_STATEMENT], cap))
            for topic, group, key, count in cursor.fetchall():
                found.setdefault((topic, group), {})[key] = int(count)
        return found
