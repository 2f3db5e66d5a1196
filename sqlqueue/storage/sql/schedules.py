"""Named statements of the schedules (``SQLQUEUE["SCHEDULES"]``, SPEC §9): the table
``queue_schedules`` holds one row per schedule, a handful of rows in all.

Exactly once per tick rests on ``claim_ticks``: a compare-and-set of ``checked_until``
run in the transaction that then publishes the claimed ticks. Two processes claiming the
same ticks serialize on the row; the second sees the first's value and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db.backends.utils import CursorWrapper

SCHEDULES_TABLE = "queue_schedules"

_COLUMNS = (
    "name", "checked_until", "definition", "last_tick", "last_topic", "last_partition_key",
    "last_offset", "last_message_id", "last_published_at",
)


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


class PublishedTick(NamedTuple):
    """The newest message a schedule published, for the row's ``last_*`` columns."""

    tick_ms: int
    topic: str
    partition_key: str
    offset: int
    message_id: str


class ScheduleStatements:
    """Mixin for ``Dialect``: the schedules' statements."""

    quote: Any
    now_ms_sql: str
    locking_read_suffix: str

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        raise NotImplementedError

    def ensure_schedules(
        self, cursor: CursorWrapper, rows: Sequence[tuple[str, int, str]]
    ) -> None:
        """``ensure_schedules``: create the rows of schedules seen for the first time, as
        (name, checked_until, definition); an existing row is left as it is."""
        sql = self.insert_if_absent(
            SCHEDULES_TABLE, ("name", "checked_until", "definition"), ("name",)
        ).format(values="%s, %s, %s")
        for row in rows:
            cursor.execute(sql, list(row))

    def read_schedules(
        self, cursor: CursorWrapper, names: Sequence[str] | None = None, *, lock: bool = False
    ) -> dict[str, ScheduleRow]:
        """``read_schedules``: the rows of ``names`` (None: every row). ``lock``: a locking
        read, which sees what other processes committed after this transaction's snapshot."""
        q = self.quote
        sql = f"SELECT {', '.join(q(c) for c in _COLUMNS)} FROM {q(SCHEDULES_TABLE)}"
        params: list[Any] = []
        if names is not None:
            if not names:
                return {}
            sql += f" WHERE {q('name')} IN ({', '.join(['%s'] * len(names))})"
            params = list(names)
        cursor.execute(sql + (self.locking_read_suffix if lock else ""), params)
        return {str(r[0]): _row(r) for r in cursor.fetchall()}

    def claim_ticks(
        self, cursor: CursorWrapper, name: str, seen: int, until: int, definition: str
    ) -> bool:
        """``claim_ticks``: move ``checked_until`` from ``seen`` (the value this process
        read) to ``until``. True: the ticks in between are this transaction's to publish;
        False: another process claimed them first (or the row is gone)."""
        q = self.quote
        cursor.execute(
            f"UPDATE {q(SCHEDULES_TABLE)} SET {q('checked_until')} = %s, "
            f"{q('definition')} = %s WHERE {q('name')} = %s AND {q('checked_until')} = %s",
            [until, definition, name, seen],
        )
        return int(cursor.rowcount) == 1

    def record_tick(self, cursor: CursorWrapper, name: str, tick: PublishedTick) -> None:
        """``record_tick``: the newest tick a schedule published and its message."""
        q = self.quote
        cursor.execute(
            f"UPDATE {q(SCHEDULES_TABLE)} SET {q('last_tick')} = %s, {q('last_topic')} = %s, "
            f"{q('last_partition_key')} = %s, {q('last_offset')} = %s, "
            f"{q('last_message_id')} = %s, {q('last_published_at')} = {self.now_ms_sql} "
            f"WHERE {q('name')} = %s",
            [tick.tick_ms, tick.topic, tick.partition_key, tick.offset, tick.message_id, name],
        )

    def delete_schedule(self, cursor: CursorWrapper, name: str) -> int:
        """``delete_schedule``: forget a schedule's row; returns how many rows went."""
        q = self.quote
        cursor.execute(f"DELETE FROM {q(SCHEDULES_TABLE)} WHERE {q('name')} = %s", [name])
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
