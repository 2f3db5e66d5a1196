"""Statements for SQLite 3.35+ (the embedded default for development and the demo).

SQLite serialises writers on the database file, so no locking read is needed: a reader
inside a write transaction already sees every committed row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import Dialect

_NEW = re.compile(r"\{new\}\(([^)]*)\)")  # {new}(col): the would-be-inserted value
_EXCLUDED = r"excluded.\1"


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    locking_read_suffix = ""

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # SQLite has one writer at a time and numbers the rows of a statement one after
        # the other (AUTOINCREMENT: never reusing a number); lastrowid is the last one.
        last = int(cursor.lastrowid)
        return list(range(last - count + 1, last + 1))

    def upsert_clause(self, key: Sequence[str], assignments: dict[str, str]) -> str:
        # SQLite evaluates every right-hand side against the old row.
        sets = ", ".join(
            f"{self.quote(column)} = {_NEW.sub(_EXCLUDED, expression)}"
            for column, expression in assignments.items()
        )
        conflict = ", ".join(self.quote(c) for c in key)
        return f"ON CONFLICT ({conflict}) DO UPDATE SET {sets}"

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        q = self.quote
        return (
            f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) VALUES ({{values}}) "
            "ON CONFLICT DO NOTHING"
        )

    def _partition_keys_cte(self) -> str:
        # SQLite has no loose index scan; a recursive query makes one: each step seeks
        # the next key after the previous one in idx_topic_partition_offset.
        q = self.quote
        table, topic, key = q("queue_messages"), q("topic"), q("partition_key")
        return (
            f"WITH RECURSIVE keys(k) AS ("
            f"SELECT MIN({key}) FROM {table} WHERE {topic} = %s "
            f"UNION ALL SELECT (SELECT MIN({key}) FROM {table} WHERE {topic} = %s "
            f"AND {key} > keys.k) FROM keys WHERE keys.k IS NOT NULL)"
        )

    def discover_partitions_sql(self) -> str:
        return f"{self._partition_keys_cte()} SELECT k FROM keys WHERE k IS NOT NULL"

    def discover_partitions_params(self, topic: str) -> list[Any]:
        return [topic, topic]

    offset_index_hint = "INDEXED BY idx_topic_partition_offset"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"MAX({a}, {b})"  # the scalar max of its arguments

    def partition_heads_sql(self) -> str:
        # The recursive seek of discovery, then one MAX seek per key.
        q = self.quote
        return (
            f"{self._partition_keys_cte()} SELECT k, (SELECT MAX({q('offset')}) FROM "
            f"{q('queue_messages')} WHERE {q('topic')} = %s AND {q('partition_key')} = keys.k) "
            f"FROM keys WHERE k IS NOT NULL"
        )

    def partition_heads_params(self, topic: str) -> list[Any]:
        return [topic, topic, topic]

    def delete_messages_upto_sql(self) -> str:
        # DELETE ... LIMIT needs a compile-time option SQLite builds usually lack.
        q = self.quote
        table, offset = q("queue_messages"), q("offset")
        return (
            f"DELETE FROM {table} WHERE {offset} IN (SELECT {offset} FROM {table} WHERE "
            f"{q('topic')} = %s AND {q('partition_key')} = %s AND {offset} <= %s "
            f"ORDER BY {offset} LIMIT %s)"
        )

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        # One writer at a time: a row is committed before the next offset is allocated,
        # so no row can ever appear below one already visible.
        return None

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        return (
            "UNIQUE constraint failed" in str(error)
            and "queue_messages.partition_key, queue_messages.id" in str(error)
        )
