"""Named statements of a consumer group's position (``queue_offsets``): its watermark on
each partition, moved forward only, and the delivery state a watermark makes history.
Both executors run them: ``sqlqueue.storage.sql.watermarks`` for ``runconsumer``, and the
Spark consumer group (``sqlqueue.integrations.spark.group``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlqueue.storage.statements.tables import GROUP_KEY, OFFSETS_TABLE, STATE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor


class WatermarkStatements(Vendor):
    """Watermarks, for any vendor (a mixin of ``Statements``)."""

    def ensure_watermarks(self, group: str, topic: str, partitions: Sequence[str],
                          watermark: int = 0) -> Statement:
        """``ensure_watermarks``: create the group's offsets rows that are missing, at
        ``watermark`` (this registers the group with garbage collection and the lag
        pages); existing rows are left alone. ``partitions`` must not be empty."""
        one = f"(%s, %s, %s, %s, {self.now_ms_sql})"
        params: list[Any] = []
        for partition in partitions:
            params += [group, topic, partition, watermark]
        columns = (*GROUP_KEY, "offset_acked", "updated_at")
        return (
            f"INSERT INTO {self.quote(OFFSETS_TABLE)} ({self.names(columns)}) "
            f"VALUES {', '.join([one] * len(partitions))} "
            + self.insert_if_absent_suffix(GROUP_KEY),
            params,
        )

    def group_watermarks(self, group: str, topic: str,
                         partitions: Sequence[str] | None = None) -> Statement:
        """``group_watermarks``: (partition, watermark) of the group on each partition of
        a topic, or on ``partitions`` only (primary key)."""
        q = self.quote
        only, keys = self.partitions_filter(partitions)
        return (
            f"SELECT {q('partition_key')}, {q('offset_acked')} FROM {q(OFFSETS_TABLE)} "
            f"WHERE {q('consumer_group')} = {self.text_mark} "
            f"AND {q('topic')} = {self.text_mark}{only}",
            [group, topic, *keys],
        )

    def advance_watermarks(self, group: str, topic: str, upto: int) -> Statement:
        """``advance_watermarks``: the group is done up to ``upto`` on every partition of
        the topic (the Spark stream's commit); a watermark only moves forward."""
        q = self.quote
        return (
            f"UPDATE {q(OFFSETS_TABLE)} SET {q('offset_acked')} = %s, "
            f"{q('updated_at')} = {self.now_ms_sql}, {q('first_pending')} = NULL "
            f"WHERE {q('consumer_group')} = {self.text_mark} "
            f"AND {q('topic')} = {self.text_mark} AND {q('offset_acked')} < %s",
            [upto, group, topic, upto],
        )

    def advance_partition_watermarks(
        self, group: str, topic: str, moves: Sequence[tuple[str, int, int | None]],
    ) -> Statement:
        """``advance_partition_watermarks``: the group is done up to ``upto`` on each
        ``(partition, upto, first_pending)`` of ``moves`` (at least one; primary-key
        lookups), in one statement however many partitions move; a watermark only moves
        forward. ``first_pending``: the first offset above it still to finish, if known
        (a hint for the lag pages, checked before use; None clears it)."""
        q = self.quote
        only, keys = self.partitions_filter([partition for partition, _, _ in moves])
        # One CASE per column, by partition; the values are cast where a database would
        # otherwise type a CASE of bare parameters (or of NULLs) as text.
        of_partition = (f"CASE {q('partition_key')} "
                        + " ".join([f"WHEN {self.text_mark} THEN {self.integer_mark}"]
                                   * len(moves))
                        + " END")
        uptos = [value for partition, upto, _ in moves for value in (partition, upto)]
        pendings = [value for partition, _, first in moves for value in (partition, first)]
        return (
            f"UPDATE {q(OFFSETS_TABLE)} SET {q('offset_acked')} = {of_partition}, "
            f"{q('updated_at')} = {self.now_ms_sql}, {q('first_pending')} = {of_partition} "
            f"WHERE {q('consumer_group')} = {self.text_mark} "
            f"AND {q('topic')} = {self.text_mark}{only} "
            f"AND {q('offset_acked')} < {of_partition}",
            [*uptos, *pendings, group, topic, *keys, *uptos],
        )

    def topic_watermarks(self, topic: str) -> Statement:
        """``topic_watermarks``: (group, partition, watermark) of every group known on a
        topic, in one read of ``idx_topic_partition``."""
        q = self.quote
        return (
            f"SELECT {q('consumer_group')}, {q('partition_key')}, {q('offset_acked')} "
            f"FROM {q(OFFSETS_TABLE)} WHERE {q('topic')} = {self.text_mark}",
            [topic],
        )

    def delete_states_upto(self, group: str, topic: str,
                           limits: Sequence[tuple[str, int]]) -> Statement:
        """``delete_states_upto``: drop the delivery state each ``(partition, upto)`` of
        ``limits`` covers (at least one; a primary-key range each). Run only after the
        watermarks that cover it committed."""
        q = self.quote
        one = f"({q('partition_key')} = {self.text_mark} AND {q('message_offset')} <= %s)"
        return (
            f"DELETE FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = {self.text_mark} AND "
            f"{q('topic')} = {self.text_mark} AND ({' OR '.join([one] * len(limits))})",
            [group, topic, *(value for limit in limits for value in limit)],
        )
