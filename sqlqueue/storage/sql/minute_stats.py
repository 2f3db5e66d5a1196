"""The per-minute rollup on a Django connection (``queue_minute_stats``, issue 42). The
statements are built once, in ``sqlqueue.storage.statements.minute_stats``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks

#: (group, topic, minute) -> column -> amount
MinuteCounts = Mapping[tuple[str, str, int], Mapping[str, float]]


class MinuteStatsAccess(VendorHooks):
    """Mixin for ``Store``: the rollup's rows."""

    def add_minute_stats(self, cursor: CursorWrapper, counts: MinuteCounts) -> None:
        """``add_minute_stats``, one upsert per (group, topic, minute) with something to
        add (run them in one transaction)."""
        for (group, topic, minute), columns in counts.items():
            cursor.execute(*self.sql.add_minute_stats(group, topic, minute, columns))

    def read_minute_stats(self, cursor: CursorWrapper, since: int,
                          columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """``read_minute_stats``: (group, topic, minute, *columns) from ``since`` on."""
        cursor.execute(*self.sql.read_minute_stats(since, columns))
        return [tuple(row) for row in cursor.fetchall()]

    def delete_minute_stats(self, cursor: CursorWrapper, keep_ms: int) -> int:
        """``delete_minute_stats``: rows deleted."""
        cursor.execute(*self.sql.delete_minute_stats(keep_ms))
        return int(cursor.rowcount)
