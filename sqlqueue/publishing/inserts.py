"""Storing validated message rows: one message (``insert_one``) or a chunk of a batch
(``store_chunk``), an id still stored in its partition being a dedup hit; and what keeps
each statement within what the server takes (``check_fits``, ``message_chunks``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.exceptions import InvalidMessage
from sqlqueue.publishing.messages import SentMessage
from sqlqueue.storage.chunks import statement_chunks
from sqlqueue.storage.sql import MessageRow, Store

# A duplicate-key error means another transaction stored the same id between our read
# and our insert; after this many rounds something else is wrong and the error surfaces.
MAX_DEDUP_ROUNDS = 3


def insert_one(
    connection: BaseDatabaseWrapper, store: Store, topic: str, row: MessageRow,
    wake: str | None = None, prepared: bool = False,
) -> SentMessage:
    """Store one message; an id still stored in its partition is a dedup hit. ``wake``
    and ``prepared``: ``Store.insert_messages``'s (``wake`` sent only if the row is
    stored)."""
    for round_ in range(MAX_DEDUP_ROUNDS):
        cursor = store.publishing_cursor()
        try:
            offsets = store.insert_messages(cursor, [row], wake=wake, prepared=prepared)
        except IntegrityError as error:
            if not store.is_duplicate_message(error) or round_ == MAX_DEDUP_ROUNDS - 1:
                raise
        else:
            assert offsets is not None  # a single row's offset is always known
            return SentMessage(topic, row.partition_key, row.id, offsets[0], created=True)
        with connection.cursor() as reading:  # the kept cursor is insert_messages' only
            found = store.select_message_offsets(
                reading, topic, [row.key], lock=connection.in_atomic_block
            )
        if row.key in found:
            return SentMessage(topic, row.partition_key, row.id, found[row.key], created=False)
        # The duplicate vanished (garbage-collected) between the two statements: insert again.
    raise AssertionError("unreachable")  # pragma: no cover


def store_chunk(
    connection: BaseDatabaseWrapper, store: Store, topic: str, chunk: Sequence[MessageRow]
) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """Insert the rows of ``chunk`` not yet stored; return every row's offset, and the new ones."""
    # Ids that sqlqueue just generated (UUIDv7) cannot be stored yet: no lookup for them.
    may_exist = [row.key for row in chunk if not row.fresh_id]
    with connection.cursor() as cursor:
        for round_ in range(MAX_DEDUP_ROUNDS):
            # First round: a plain read. After a duplicate-key error: a locking read, which
            # sees rows committed after this transaction's snapshot was taken.
            existing = store.select_message_offsets(cursor, topic, may_exist, lock=round_ > 0)
            new_rows = [row for row in chunk if row.key not in existing]
            if not new_rows:
                return existing, set()
            try:
                offsets = store.insert_messages(cursor, new_rows)
            except IntegrityError as error:
                if not store.is_duplicate_message(error) or round_ == MAX_DEDUP_ROUNDS - 1:
                    raise
                continue
            new_keys = [row.key for row in new_rows]
            if offsets is None:
                stored = store.select_message_offsets(cursor, topic, new_keys, lock=False)
            else:
                stored = dict(zip(new_keys, offsets, strict=True))
            return {**existing, **stored}, set(new_keys)
    raise AssertionError("unreachable")  # pragma: no cover


def check_fits(store: Store, row: MessageRow, where: str = "") -> None:
    """Refuse, before anything is sent, a message whose statement the server would not
    take (MySQL's ``max_allowed_packet``: the connection would be dropped mid-send with
    "server has gone away"). Payload and metadata each count as escaped."""
    limit = store.max_row_bytes()
    if limit is None:
        return
    metadata = row.metadata or ""
    if 2 * len(row.payload) + 8 * len(metadata) <= limit:
        return  # fits even if every byte were escaped (the common case: no measuring)
    size = store.literal_bytes(row.payload, row.metadata)
    if size > limit:
        raise InvalidMessage(
            f"{where}the payload and metadata take {size} bytes as escaped literals; the "
            f"database server takes statements of at most {limit} bytes for them "
            "(max_allowed_packet, less the statement). Raise max_allowed_packet, or send "
            "less.")


def message_chunks(rows: Sequence[MessageRow], store: Store) -> Iterable[Sequence[MessageRow]]:
    """Split ``rows`` so each statement stays under the row, parameter and byte limits."""
    max_params = store.max_query_params()
    max_rows = max(1, min(store.max_rows_per_insert, max_params // 10))
    literal_bytes = store.literal_bytes
    return statement_chunks(
        rows, max_rows=max_rows, max_bytes=store.max_statement_bytes(),
        size_of=lambda row: literal_bytes(row.payload, row.metadata) + 1024)
