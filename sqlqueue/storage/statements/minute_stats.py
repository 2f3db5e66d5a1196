"""Named statements of the per-minute rollup (``queue_minute_stats``, issue 42): the
runners add to it, the admin's live overview reads the last hour, garbage collection
deletes what is older than that. A handful of rows per (group, topic) and minute."""

from __future__ import annotations

from collections.abc import Mapping

from sqlqueue.storage.statements.tables import MINUTE_STATS_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the key of a row: one per group, topic and minute (epoch ms of its start)
MINUTE_STATS_KEY = ("consumer_group", "topic", "minute")


class MinuteStatsStatements(Vendor):
    """The rollup's statements, for any vendor (a mixin of ``Statements``)."""

    def add_minute_stats(self, group: str, topic: str, minute: int,
                         counts: Mapping[str, float]) -> Statement:
        """``add_minute_stats``: add ``counts`` (column -> amount) to a minute's row,
        creating it: one upsert, whichever runner writes first."""
        q = self.quote
        columns = (*MINUTE_STATS_KEY, *counts)
        clause = self.upsert_clause(MINUTE_STATS_KEY, {
            column: f"{q(column)} + {{new}}({q(column)})" for column in counts
        }, table=MINUTE_STATS_TABLE)
        return (f"INSERT INTO {q(MINUTE_STATS_TABLE)} ({self.names(columns)}) "
                f"VALUES ({self.marks(len(columns))}) {clause}",
                [group, topic, minute, *counts.values()])

    def read_minute_stats(self, since: int, columns: tuple[str, ...]) -> Statement:
        """``read_minute_stats``: the rows of the minutes from ``since`` (epoch ms) on, as
        (group, topic, minute, *columns), in that order."""
        q = self.quote
        return (f"SELECT {self.names((*MINUTE_STATS_KEY, *columns))} FROM "
                f"{q(MINUTE_STATS_TABLE)} WHERE {q('minute')} >= %s "
                f"ORDER BY {self.names(MINUTE_STATS_KEY)}", [since])

    def read_minute_points(self, since: int, step_ms: int,
                           columns: tuple[str, ...]) -> Statement:
        """``read_minute_points``: the rows of the minutes from ``since`` on, summed per
        point of ``step_ms`` (a chart over hours), as (group, topic, point's start,
        *columns): point k sums the minutes ``since + k * step_ms`` up to the next point."""
        q = self.quote
        point = (f"{int(since)} + " + self.int_div_sql.format(
            a=f"{q('minute')} - {int(since)}", b=str(int(step_ms))) + f" * {int(step_ms)}")
        sums = ", ".join(f"SUM({q(column)})" for column in columns)
        return (f"SELECT {q('consumer_group')}, {q('topic')}, {point} AS {q('point')}, "
                f"{sums} FROM {q(MINUTE_STATS_TABLE)} WHERE {q('minute')} >= %s "
                f"GROUP BY {q('consumer_group')}, {q('topic')}, {q('point')} "
                f"ORDER BY {q('consumer_group')}, {q('topic')}, {q('point')}", [since])

    def delete_minute_stats(self, keep_ms: int) -> Statement:
        """``delete_minute_stats``: the rows of the minutes that started more than
        ``keep_ms`` ago (database time). Unbatched: a pass every few seconds finds at
        most a minute's rows per (group, topic) to delete."""
        q = self.quote
        return (f"DELETE FROM {q(MINUTE_STATS_TABLE)} WHERE {q('minute')} < "
                f"{self.now_ms_sql} - %s", [keep_ms])
