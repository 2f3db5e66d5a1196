"""``MemoryStore``'s publishing: ``PublishStore`` (``sqlqueue.storage.protocols``) with
the semantics of ``sqlqueue.storage.statements.publishing`` (read them side by side):
an insert is all or nothing, idempotency keys expire with the database clock."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import IntegrityError
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import IdempotencyDigest, MessageKey, MessageRow
from tests.engine.memory.access import TableAccess
from tests.engine.memory.tables import StoredMessage


class MemoryDuplicateMessage(IntegrityError):
    """idx_topic_partition_id: the (topic, partition_key, id) is stored already (the
    in-memory database's; the real stores recognise their driver's errors)."""


class MemoryPublishing(TableAccess):
    """A part of ``MemoryStore``: ``PublishStore``."""

    #: rows per publishing INSERT (as the real stores'; no driver limits here)
    max_rows_per_insert = 500
    #: nothing listens: the harness steps the runners instead of waking them
    notifies_wakeups = False

    def check_connection(self) -> None:
        pass  # no text to store wrongly: rows are Python objects

    def publishing_cursor(self) -> CursorWrapper:
        return self.connection.cursor()

    def max_query_params(self) -> int:
        return self.connection.features.max_query_params or 65_535

    def max_statement_bytes(self) -> int:
        return 8 << 20

    def max_row_bytes(self) -> int | None:
        return None  # no server to refuse a large statement

    def literal_bytes(self, payload: bytes | str, metadata: str | None) -> int:
        return len(payload) + len((metadata or "").encode("utf-8"))

    def notify_wakeup(self, cursor: Any, topic: str) -> None:
        pass

    def insert_messages(self, cursor: Any, rows: Sequence[MessageRow], *,
                        wake: str | None = None, prepared: bool = False) -> list[int] | None:
        """All rows or none: a (topic, partition_key, id) stored already fails the
        statement (``MemoryDuplicateMessage``)."""
        t, now = self._tables("insert_messages"), self._now()
        keys = [(r.topic, r.partition_key, r.id) for r in rows]
        if len(set(keys)) < len(keys) or any(key in t.message_ids for key in keys):
            raise MemoryDuplicateMessage("duplicate key value violates idx_topic_partition_id")
        offsets = []
        for row in rows:
            offset = self.database.allocate_offset()
            deliver_after = now + row.delay_ms if row.delay_ms is not None else row.deliver_at_ms
            t.messages[offset] = StoredMessage(
                offset, row.topic, row.partition_key, row.id, bytes(row.payload), row.metadata,
                now, row.published_at, row.priority, deliver_after)
            t.message_ids[(row.topic, row.partition_key, row.id)] = offset
            offsets.append(offset)
        return offsets

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        return isinstance(error, MemoryDuplicateMessage)

    def select_message_offsets(self, cursor: Any, topic: str, keys: Iterable[MessageKey], *,
                               lock: bool) -> dict[MessageKey, int]:
        ids = self._tables("select_message_offsets").message_ids
        return {(pk, mid): ids[(topic, pk, mid)] for pk, mid in keys if (topic, pk, mid) in ids}

    def select_idempotency_keys(self, cursor: Any, digests: Sequence[IdempotencyDigest], *,
                                lock: bool) -> dict[IdempotencyDigest, int]:
        t, now = self._tables("select_idempotency_keys"), self._now()
        return {d: t.idempotency[d][0] for d in digests
                if d in t.idempotency and t.idempotency[d][1] > now}

    def remember_idempotency_keys(self, cursor: Any, keys: Sequence[tuple[int, int, int]],
                                  window_ms: int) -> None:
        t, now = self._tables("remember_idempotency_keys"), self._now()
        for high, low, offset in keys:
            t.idempotency[(high, low)] = (offset, now + window_ms)

    def delete_expired_idempotency_keys(self, cursor: Any, limit: int) -> int:
        t, now = self._tables("delete_expired_idempotency_keys"), self._now()
        expired = sorted((d for d, (_, expires) in t.idempotency.items() if expires <= now),
                         key=lambda d: t.idempotency[d][1])[:limit]
        for digest in expired:
            del t.idempotency[digest]
        return len(expired)
