"""Statements SQLite and PostgreSQL share: the same ``ON CONFLICT`` upserts, and neither
has a loose index scan. Each is written once, here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_NEW = re.compile(r"\{new\}\(([^)]*)\)")  # {new}(col): the would-be-inserted value
_EXCLUDED = r"excluded.\1"


class OnConflict:
    """Mixin for ``Dialect`` (before it in the bases): ``INSERT ... ON CONFLICT``."""

    quote: Any

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        # Every right-hand side is evaluated against the old row (both databases).
        sets = ", ".join(
            f"{self.quote(column)} = "
            f"{self.stored_columns(_NEW.sub(_EXCLUDED, expression), table)}"
            for column, expression in assignments.items()
        )
        conflict = ", ".join(self.quote(c) for c in key)
        return f"ON CONFLICT ({conflict}) DO UPDATE SET {sets}"

    def stored_columns(self, expression: str, table: str) -> str:
        """``expression`` with its bare columns naming the stored row's (SQLite reads
        them so already)."""
        return expression

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        q = self.quote
        return (
            f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) VALUES ({{values}}) "
            "ON CONFLICT DO NOTHING"
        )


class RecursiveKeyScan:
    """Mixin for ``Dialect`` (before it in the bases)."""

    quote: Any

    def _partition_keys_cte(self) -> str:
        # A recursive query makes the loose index scan: each step seeks the next key after
        # the previous one in idx_topic_partition_offset (a MIN over an index prefix is
        # one seek on both databases).
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
