"""What every vendor's statements share; the vendor modules fill in the differences."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

MESSAGE_TABLE = "queue_messages"
MessageKey = tuple[str, str]  # (partition_key, id) within one topic


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One validated message, ready for ``INSERT`` (see sqlqueue.publishing)."""

    topic: str
    partition_key: str
    id: str
    payload: bytes
    metadata: str | None  # JSON text, or None for an empty map (the RFC stores NULL)
    published_at: int  # epoch ms, publisher's clock
    priority: int
    delay_ms: int | None  # deliver_after = database now + delay_ms ...
    deliver_at_ms: int  # ... or this absolute epoch ms when delay_ms is None (0 = at once)
    #: the id is a fresh UUID4 made by sqlqueue, so it cannot already be stored
    fresh_id: bool = False

    @property
    def key(self) -> MessageKey:
        return (self.partition_key, self.id)


class Dialect:
    """Named statements for one database vendor, bound to one connection."""

    vendor = ""
    #: SQL expression for the database clock in epoch milliseconds (one value per statement).
    now_ms_sql = ""
    #: appended to reads that must see the newest committed rows, not the snapshot
    locking_read_suffix = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.quote = connection.ops.quote_name

    # -- insert_messages ---------------------------------------------------------------
    insert_verb = "INSERT INTO"
    _INSERT_COLUMNS = (
        "topic", "partition_key", "id", "payload", "metadata", "created_at",
        "published_at", "priority", "deliver_after",
    )

    def insert_messages_sql(self, count: int) -> str:
        """``insert_messages``: a multi-row INSERT; a duplicate key fails the statement."""
        columns = ", ".join(self.quote(c) for c in self._INSERT_COLUMNS)
        now = self.now_ms_sql
        one_row = f"(%s, %s, %s, %s, %s, {now}, %s, %s, COALESCE({now} + %s, %s))"
        values = ", ".join([one_row] * count)
        return f"{self.insert_verb} {self.quote(MESSAGE_TABLE)} ({columns}) VALUES {values}"

    @staticmethod
    def insert_messages_params(rows: Sequence[MessageRow]) -> list[Any]:
        params: list[Any] = []
        for r in rows:
            params += [r.topic, r.partition_key, r.id, r.payload, r.metadata,
                       r.published_at, r.priority, r.delay_ms, r.deliver_at_ms]
        return params

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow]
    ) -> list[int] | None:
        """Insert ``rows``; return their offsets in order, or None if they cannot be known
        without reading them back.

        Raises ``IntegrityError`` if any row's (topic, partition_key, id) exists; the
        statement is then rolled back as a whole and the transaction stays usable.
        """
        cursor.execute(self.insert_messages_sql(len(rows)), self.insert_messages_params(rows))
        return self.inserted_offsets(cursor, len(rows))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        """The offsets the last ``insert_messages`` of ``count`` rows allocated, if known."""
        raise NotImplementedError

    # -- select_message_offsets --------------------------------------------------------
    def select_message_offsets_sql(self, count: int, *, lock: bool) -> str:
        """``select_message_offsets``: offsets of (partition_key, id) pairs of one topic.

        An OR of full-key equalities, which every vendor turns into ``count`` point
        lookups on ``idx_topic_partition_id`` (SQLite needs the topic in every term).
        """
        q = self.quote
        term = f"({q('topic')} = %s AND {q('partition_key')} = %s AND {q('id')} = %s)"
        suffix = self.locking_read_suffix if lock else ""
        return (
            f"SELECT {q('offset')}, {q('partition_key')}, {q('id')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {' OR '.join([term] * count)}{suffix}"
        )

    def select_message_offsets(
        self, cursor: CursorWrapper, topic: str, keys: Iterable[MessageKey], *, lock: bool
    ) -> dict[MessageKey, int]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        params: list[Any] = []
        for partition_key, message_id in wanted:
            params += [topic, partition_key, message_id]
        cursor.execute(self.select_message_offsets_sql(len(wanted), lock=lock), params)
        return {(pk, mid): int(offset) for offset, pk, mid in cursor.fetchall()}

    # -- database_now_ms ---------------------------------------------------------------
    def database_now_ms(self, cursor: CursorWrapper) -> int:
        """``database_now_ms``: the database clock, epoch milliseconds."""
        cursor.execute(f"SELECT {self.now_ms_sql}")
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    # -- errors ------------------------------------------------------------------------
    def is_duplicate_message(self, error: IntegrityError) -> bool:
        """Did ``error`` come from ``idx_topic_partition_id`` (an idempotent-publish hit)?"""
        raise NotImplementedError

    def max_statement_bytes(self) -> int:
        """Upper bound for one multi-row statement's size."""
        return 8 << 20
