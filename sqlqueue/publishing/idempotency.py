"""Ids of the caller's remembered for ``IDEMPOTENCY_WINDOW`` (the table
``queue_idempotency_keys``): a publish of an id published within the window writes
nothing and returns the first one's offset, also once that message is collected. A key
and its message are stored together or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.conf import QueueSettings
from sqlqueue.publishing.inserts import insert_one, store_chunk
from sqlqueue.publishing.messages import SentMessage, idempotency_digest
from sqlqueue.publishing.wakeups import announce, notification_to_send
from sqlqueue.storage.sql import MessageRow, Store


def store_remembered_one(connection: BaseDatabaseWrapper, store: Store, topic: str,
                         row: MessageRow, conf: QueueSettings) -> SentMessage:
    """``send_message`` of a validated ``row`` with an id of the caller's."""
    window_ms = round(conf.IDEMPOTENCY_WINDOW * 1000)
    digest = idempotency_digest(topic, row.partition_key, row.id)
    with together(connection):
        with connection.cursor() as cursor:
            remembered = store.select_idempotency_keys(cursor, [digest], lock=True)
        if digest in remembered:
            return SentMessage(topic, row.partition_key, row.id, remembered[digest],
                               created=False)
        wake = notification_to_send(connection, store, topic, conf)
        sent = insert_one(connection, store, topic, row, wake, conf.PREPARED_PUBLISH)
        if sent.created:
            with connection.cursor() as cursor:
                store.remember_idempotency_keys(cursor, [(*digest, sent.offset)], window_ms)
            announce(connection, store, topic, conf, notified=wake is not None)
        return sent


def store_remembered_chunk(
    connection: BaseDatabaseWrapper, store: Store, topic: str, chunk: Sequence[MessageRow],
    window_ms: int,
) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """``store_chunk`` for a chunk with ids of the caller's: those published within the
    window are absorbed even if their messages were collected; the others' keys are
    remembered. Runs inside a transaction."""
    digests = {row.key: idempotency_digest(topic, row.partition_key, row.id)
               for row in chunk if not row.fresh_id}
    with connection.cursor() as cursor:
        remembered = store.select_idempotency_keys(cursor, list(digests.values()), lock=True)
    absorbed = {key: remembered[digest] for key, digest in digests.items()
                if digest in remembered}
    rest = [row for row in chunk if row.key not in absorbed]
    if not rest:
        return absorbed, set()
    offsets, created = store_chunk(connection, store, topic, rest)
    with connection.cursor() as cursor:
        # In key order: concurrent publishers lock the keys in the same order.
        store.remember_idempotency_keys(cursor, sorted(
            (*digests[key], offsets[key]) for key in created if key in digests
        ), window_ms)
    return {**absorbed, **offsets}, created


def together(connection: BaseDatabaseWrapper) -> Any:
    """The message and its idempotency key in one transaction. Inside the caller's, no
    savepoint (two more round trips): an error between the two statements then dooms the
    caller's transaction (Django refuses to commit it), so neither is ever committed
    without the other."""
    return transaction.atomic(using=connection.alias, savepoint=False)
