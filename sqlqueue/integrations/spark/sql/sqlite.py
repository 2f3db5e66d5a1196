"""SQLite 3.35+ statements of the data source."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlqueue.integrations.spark.sql.base import MESSAGES, Statement, Statements

_NEW = re.compile(r"\{new\}\(([^)]*)\)")  # {new}(col): the would-be-inserted value
_EXCLUDED = r"excluded.\1"


class SQLiteStatements(Statements):
    vendor = "sqlite"
    placeholder = "?"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    # One writer at a time: BEGIN IMMEDIATE takes the write lock at once, so a writer
    # waits for another instead of failing halfway with "database is locked".
    begin_sql = "BEGIN IMMEDIATE"
    # A range of the log is read by rowid range, not by scanning every index entry of
    # the topic (which SQLite prefers when a topic is given).
    no_index = "+"

    def insert_if_absent_suffix(self, key: Sequence[str]) -> str:
        return f"ON CONFLICT ({self._names(key)}) DO NOTHING"

    def upsert_clause(self, key: Sequence[str], assignments: dict[str, str]) -> str:
        # SQLite evaluates every right-hand side against the old row.
        sets = ", ".join(
            f"{self.quote(column)} = {_NEW.sub(_EXCLUDED, expression)}"
            for column, expression in assignments.items()
        )
        return f"ON CONFLICT ({self._names(key)}) DO UPDATE SET {sets}"

    def discover_partitions(self, topic: str) -> Statement:
        # No loose index scan in SQLite: a recursive query makes one, each step seeking
        # the next key after the previous one in idx_topic_partition_offset.
        q = self.quote
        table, column, key = q(MESSAGES), q("topic"), q("partition_key")
        return (
            f"WITH RECURSIVE keys(k) AS (SELECT MIN({key}) FROM {table} WHERE {column} = %s "
            f"UNION ALL SELECT (SELECT MIN({key}) FROM {table} WHERE {column} = %s "
            f"AND {key} > keys.k) FROM keys WHERE keys.k IS NOT NULL) "
            f"SELECT k FROM keys WHERE k IS NOT NULL",
            [topic, topic],
        )
