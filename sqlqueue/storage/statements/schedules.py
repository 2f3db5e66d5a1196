"""Named statements of the schedules (``SQLQUEUE["SCHEDULES"]``, docs/guides/schedules.md):
the table ``queue_schedules`` holds one row per schedule, a handful of rows in all.

Exactly once per tick rests on ``claim_ticks``: a compare-and-set of ``checked_until``
run in the transaction that then publishes the claimed ticks. Two processes claiming the
same ticks serialize on the row; the second sees the first's value and changes nothing.
``sqlqueue.storage.sql.schedules`` runs them on a Django connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlqueue.storage.statements.tables import SCHEDULES_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the columns ``read_schedules`` reads, in order
SCHEDULE_COLUMNS = (
    "name", "checked_until", "definition", "last_tick", "last_topic", "last_partition_key",
    "last_offset", "last_message_id", "last_published_at",
)


class PublishedTick(NamedTuple):
    """The newest message a schedule published, for the row's ``last_*`` columns."""

    tick_ms: int
    topic: str
    partition_key: str
    offset: int
    message_id: str


class ScheduleStatements(Vendor):
    """The schedules' statements, for any vendor (a mixin of ``Statements``)."""

    def ensure_schedule(self, name: str, checked_until: int, definition: str) -> Statement:
        """``ensure_schedule``: create the row of a schedule seen for the first time; an
        existing row is left as it is."""
        columns = ("name", "checked_until", "definition")
        return (f"INSERT INTO {self.quote(SCHEDULES_TABLE)} ({self.names(columns)}) "
                f"VALUES (%s, %s, %s) {self.insert_if_absent_suffix(('name',))}",
                [name, checked_until, definition])

    def read_schedules(self, names: Sequence[str] | None = None, *,
                       lock: bool = False) -> Statement:
        """``read_schedules``: the rows of ``names`` (None: every row; not empty), as
        ``SCHEDULE_COLUMNS``. ``lock``: a locking read, which sees what other processes
        committed after this transaction's snapshot."""
        q = self.quote
        where = ("" if names is None
                 else f" WHERE {q('name')} IN ({self.text_marks(len(names))})")
        return (f"SELECT {self.names(SCHEDULE_COLUMNS)} FROM {q(SCHEDULES_TABLE)}{where}"
                + (self.locking_read_suffix if lock else ""), list(names or ()))

    def claim_ticks(self, name: str, seen: int, until: int, definition: str) -> Statement:
        """``claim_ticks``: move ``checked_until`` from ``seen`` (the value this process
        read) to ``until``. One row changed: the ticks in between are this transaction's
        to publish; none: another process claimed them first (or the row is gone)."""
        q = self.quote
        return (
            f"UPDATE {q(SCHEDULES_TABLE)} SET {q('checked_until')} = %s, "
            f"{q('definition')} = %s WHERE {q('name')} = {self.text_mark} "
            f"AND {q('checked_until')} = %s",
            [until, definition, name, seen],
        )

    def record_tick(self, name: str, tick: PublishedTick) -> Statement:
        """``record_tick``: the newest tick a schedule published and its message."""
        q = self.quote
        return (
            f"UPDATE {q(SCHEDULES_TABLE)} SET {q('last_tick')} = %s, {q('last_topic')} = %s, "
            f"{q('last_partition_key')} = %s, {q('last_offset')} = %s, "
            f"{q('last_message_id')} = %s, {q('last_published_at')} = {self.now_ms_sql} "
            f"WHERE {q('name')} = {self.text_mark}",
            [tick.tick_ms, tick.topic, tick.partition_key, tick.offset, tick.message_id, name],
        )

    def delete_schedule(self, name: str) -> Statement:
        """``delete_schedule``: forget a schedule's row."""
        q = self.quote
        return (f"DELETE FROM {q(SCHEDULES_TABLE)} WHERE {q('name')} = {self.text_mark}",
                [name])
