"""``send_message`` and ``send_messages``: transactional, idempotent publishing.

Both join the caller's transaction on the queue's database: inside
``transaction.atomic()`` a message exists for consumers only if that block commits;
outside one, it commits at once. Input is validated completely before any SQL runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionDoesNotExist

from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.exceptions import InvalidMessage
from sqlqueue.publishing.messages import (
    DEFAULT_PRIORITY,
    OutgoingMessage,
    SentMessage,
    check_topic,
    now_ms,
    prepare,
)
from sqlqueue.storage.sql import Dialect, MessageRow, dialect_for

# A duplicate-key error means another transaction stored the same id between our read
# and our insert; after this many rounds something else is wrong and the error surfaces.
MAX_DEDUP_ROUNDS = 3


def send_message(
    topic: str,
    payload: Any,
    *,
    partition_key: str | None = None,
    id: str | None = None,
    metadata: Mapping[str, str] | None = None,
    priority: int = DEFAULT_PRIORITY,
    delay: float | timedelta | None = None,
    deliver_at: datetime | None = None,
    using: str | None = None,
) -> SentMessage:
    """Publish one message to ``topic``; one INSERT on the happy path.

    Publishing an ``id`` that is already stored in (topic, partition_key) writes nothing
    and returns the stored message's offset with ``created=False``.
    """
    conf = get_settings()
    topic = check_topic(topic, conf)
    message = OutgoingMessage(payload, partition_key, id, metadata, priority, delay, deliver_at)
    row = prepare(topic, message, conf, now_ms())
    connection = _connection(using, conf)
    dialect = dialect_for(connection)
    for round_ in range(MAX_DEDUP_ROUNDS):
        with connection.cursor() as cursor:
            try:
                offsets = dialect.insert_messages(cursor, [row])
            except IntegrityError as error:
                if not dialect.is_duplicate_message(error) or round_ == MAX_DEDUP_ROUNDS - 1:
                    raise
            else:
                assert offsets is not None  # a single row's offset is always known
                return SentMessage(topic, row.partition_key, row.id, offsets[0], created=True)
            found = dialect.select_message_offsets(
                cursor, topic, [row.key], lock=connection.in_atomic_block
            )
        if row.key in found:
            return SentMessage(topic, row.partition_key, row.id, found[row.key], created=False)
        # The duplicate vanished (garbage-collected) between the two statements: insert again.
    raise AssertionError("unreachable")  # pragma: no cover


def send_messages(
    topic: str,
    messages: Iterable[OutgoingMessage | Any],
    *,
    using: str | None = None,
) -> list[SentMessage]:
    """Publish many messages to ``topic``, all or nothing, in a few multi-row statements.

    Items may be ``OutgoingMessage`` objects or bare payloads. Returns one ``SentMessage``
    per item, in order; an id repeated within the batch or already stored is reported
    with ``created=False`` and the stored offset.
    """
    conf = get_settings()
    topic = check_topic(topic, conf)
    published_at = now_ms()
    rows = [
        _prepare_item(topic, index, item, conf, published_at)
        for index, item in enumerate(messages)
    ]
    if not rows:
        return []
    connection = _connection(using, conf)
    dialect = dialect_for(connection)

    first_of_key: dict[tuple[str, str], MessageRow] = {}
    for row in rows:
        first_of_key.setdefault(row.key, row)
    unique_rows = list(first_of_key.values())
    offsets: dict[tuple[str, str], int] = {}
    created: set[tuple[str, str]] = set()
    chunks = list(_chunks(unique_rows, dialect))
    # One statement stores a chunk whole or not at all (a failed statement is undone on
    # its own), so a single chunk needs no transaction or savepoint of its own.
    with transaction.atomic(using=connection.alias) if len(chunks) > 1 else nullcontext():
        for chunk in chunks:
            chunk_offsets, chunk_created = _store_chunk(connection, dialect, topic, chunk)
            offsets.update(chunk_offsets)
            created.update(chunk_created)

    results: list[SentMessage] = []
    for row in rows:
        first_time = row.key in created
        created.discard(row.key)  # a repeat within the batch is a dedup hit of the first
        results.append(
            SentMessage(topic, row.partition_key, row.id, offsets[row.key], created=first_time)
        )
    return results


def _prepare_item(
    topic: str, index: int, item: Any, conf: QueueSettings, published_at: int
) -> MessageRow:
    message = item if isinstance(item, OutgoingMessage) else OutgoingMessage(item)
    try:
        return prepare(topic, message, conf, published_at)
    except InvalidMessage as exc:
        raise InvalidMessage(f"message {index}: {exc}") from exc


def _store_chunk(
    connection: BaseDatabaseWrapper, dialect: Dialect, topic: str, chunk: Sequence[MessageRow]
) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """Insert the rows of ``chunk`` not yet stored; return every row's offset, and the new ones."""
    # Ids that sqlqueue just generated (UUID4) cannot be stored yet: no lookup for them.
    may_exist = [row.key for row in chunk if not row.fresh_id]
    with connection.cursor() as cursor:
        for round_ in range(MAX_DEDUP_ROUNDS):
            # First round: a plain read. After a duplicate-key error: a locking read, which
            # sees rows committed after this transaction's snapshot was taken.
            existing = dialect.select_message_offsets(cursor, topic, may_exist, lock=round_ > 0)
            new_rows = [row for row in chunk if row.key not in existing]
            if not new_rows:
                return existing, set()
            try:
                offsets = dialect.insert_messages(cursor, new_rows)
            except IntegrityError as error:
                if not dialect.is_duplicate_message(error) or round_ == MAX_DEDUP_ROUNDS - 1:
                    raise
                continue
            new_keys = [row.key for row in new_rows]
            if offsets is None:
                stored = dialect.select_message_offsets(cursor, topic, new_keys, lock=False)
            else:
                stored = dict(zip(new_keys, offsets, strict=True))
            return {**existing, **stored}, set(new_keys)
    raise AssertionError("unreachable")  # pragma: no cover


def _chunks(rows: Sequence[MessageRow], dialect: Dialect) -> Iterable[Sequence[MessageRow]]:
    """Split ``rows`` so each statement stays under the row, parameter and byte limits."""
    max_params = dialect.connection.features.max_query_params or 65_535
    max_rows = max(1, min(dialect.max_rows_per_insert, max_params // 10))
    max_bytes = dialect.max_statement_bytes()
    chunk: list[MessageRow] = []
    size = 0
    for row in rows:
        row_bytes = len(row.payload) + len(row.metadata or "") + 1024
        if chunk and (len(chunk) >= max_rows or size + row_bytes > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_bytes
    if chunk:
        yield chunk


def _connection(using: str | None, conf: QueueSettings) -> BaseDatabaseWrapper:
    alias = using or conf.DATABASE or DEFAULT_DB_ALIAS
    try:
        return connections[alias]
    except ConnectionDoesNotExist as exc:
        raise InvalidMessage(f"using={alias!r} is not a database alias in DATABASES.") from exc
