"""The schedules (``SQLQUEUE["SCHEDULES"]``, docs/guides/schedules.md) on a Django connection. The
statements are built once, in ``sqlqueue.storage.statements.schedules`` (which says why
``claim_ticks`` publishes every tick exactly once); these methods run them and shape the
rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.statements import Statements
from sqlqueue.storage.statements.schedules import PublishedTick


class ScheduleRow(NamedTuple):
    name: str
    checked_until: int
    definition: str
    last_tick: int | None
    last_topic: str
    last_partition_key: str
    last_offset: int | None
    last_message_id: str
    last_published_at: int | None


class ScheduleAccess:
    """Mixin for ``Store``: the schedules' statements."""

    sql: Statements

    def ensure_schedules(
        self, cursor: CursorWrapper, rows: Sequence[tuple[str, int, str]]
    ) -> None:
        """``ensure_schedule``: create the rows of schedules seen for the first time, as
        (name, checked_until, definition); an existing row is left as it is."""
        for row in rows:
            cursor.execute(*self.sql.ensure_schedule(*row))

    def read_schedules(
        self, cursor: CursorWrapper, names: Sequence[str] | None = None, *, lock: bool = False
    ) -> dict[str, ScheduleRow]:
        """``read_schedules``: the rows of ``names`` (None: every row). ``lock``: a locking
        read, which sees what other processes committed after this transaction's snapshot."""
        if names is not None and not names:
            return {}
        cursor.execute(*self.sql.read_schedules(names, lock=lock))
        return {str(r[0]): _row(r) for r in cursor.fetchall()}

    def claim_ticks(
        self, cursor: CursorWrapper, name: str, seen: int, until: int, definition: str
    ) -> bool:
        """``claim_ticks``: True: the ticks in between are this transaction's to publish;
        False: another process claimed them first (or the row is gone)."""
        cursor.execute(*self.sql.claim_ticks(name, seen, until, definition))
        return int(cursor.rowcount) == 1

    def record_tick(self, cursor: CursorWrapper, name: str, tick: PublishedTick) -> None:
        """``record_tick``: the newest tick a schedule published and its message."""
        cursor.execute(*self.sql.record_tick(name, tick))

    def delete_schedule(self, cursor: CursorWrapper, name: str) -> int:
        """``delete_schedule``: forget a schedule's row; returns how many rows went."""
        cursor.execute(*self.sql.delete_schedule(name))
        return int(cursor.rowcount)


def _row(values: Sequence[Any]) -> ScheduleRow:
    (name, checked_until, definition, last_tick, topic, partition, offset, message_id,
     published_at) = values
    return ScheduleRow(
        str(name), int(checked_until), str(definition or ""),
        None if last_tick is None else int(last_tick), str(topic or ""), str(partition or ""),
        None if offset is None else int(offset), str(message_id or ""),
        None if published_at is None else int(published_at),
    )


__all__ = ["PublishedTick", "ScheduleAccess", "ScheduleRow"]
