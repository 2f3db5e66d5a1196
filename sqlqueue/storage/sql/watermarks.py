"""A group's watermarks on a Django connection: registering a group on a partition, where
a new group starts, moving watermarks forward, dropping the delivery state they cover,
and every group's watermarks of a topic. The statements are built once, in
``sqlqueue.storage.statements.watermarks``; these methods run them and shape the rows."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks


class WatermarkAccess(VendorHooks):
    """Mixin for ``Store``: the watermarks."""

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
        heads = self.partition_heads(cursor, topic)
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
