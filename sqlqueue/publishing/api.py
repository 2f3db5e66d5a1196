"""``send_message`` and ``send_messages``: transactional, idempotent publishing.

Both join the caller's transaction on the queue's database: inside
``transaction.atomic()`` a message exists for consumers only if that block commits;
outside one, it commits at once. Input is validated completely before any SQL runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionDoesNotExist

from sqlqueue import storage, tracing
from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.exceptions import InvalidMessage, NotMigrated
from sqlqueue.publishing.idempotency import (
    store_remembered_chunk,
    store_remembered_one,
    together,
)
from sqlqueue.publishing.inserts import check_fits, insert_one, message_chunks, store_chunk
from sqlqueue.publishing.messages import (
    DEFAULT_PRIORITY,
    OutgoingMessage,
    SentMessage,
    check_topic,
    now_ms,
    prepare,
    prepare_fields,
)
from sqlqueue.publishing.wakeups import announce, notification_to_send
from sqlqueue.storage.retry import retry_victims
from sqlqueue.storage.sql import MessageRow, Store

#: Tries of a publish made outside any transaction of the caller's that the database
#: rolled back as a lock-wait or deadlock victim (a Galera certification conflict is
#: one: two nodes storing the same id at once), and the first pause between them.
ALONE_TRIES = 5
ALONE_FIRST_PAUSE = 0.01
#: whose ``sleep`` makes those pauses: a test gives the publishing path a manual clock
#: here, instead of replacing the process's ``time.sleep`` under every thread
RETRY_CLOCK: HostClock = SYSTEM_CLOCK

_Publish = TypeVar("_Publish", bound=Callable[..., Any])
_Sent = TypeVar("_Sent")


def _retried_alone(publish: _Publish) -> _Publish:
    """``send_messages``, retried by ``_retry_alone`` when it runs outside a transaction
    of the caller's. Its messages (the first argument after the topic) are read into a
    list before the first try: an iterator is read only once."""
    @functools.wraps(publish)
    def publish_alone(topic: str, *args: Any, using: str | None = None, **kwargs: Any) -> Any:
        connection = _alone_connection(using, topic)
        if connection is None:
            return publish(topic, *args, using=using, **kwargs)
        if args and not isinstance(args[0], list):
            args = (list(args[0]), *args[1:])
        elif not isinstance(kwargs.get("messages", []), list):
            kwargs["messages"] = list(kwargs["messages"])
        return _retry_alone(connection, lambda: publish(topic, *args, using=using, **kwargs))

    return publish_alone  # type: ignore[return-value]


def _naming_migrate(publish: _Publish) -> _Publish:
    """A publish on a database nobody migrated raises ``NotMigrated``, which names
    ``manage.py migrate``, instead of the driver's "table doesn't exist" (the driver's
    error stays attached as its cause)."""
    @functools.wraps(publish)
    def publish_or_name_migrate(topic: str, *args: Any, using: str | None = None,
                                **kwargs: Any) -> Any:
        try:
            return publish(topic, *args, using=using, **kwargs)
        except DatabaseError as error:
            if not Store.is_missing_queue_table(error):
                raise
            alias = _connection(using, get_settings(), topic).alias
            raise NotMigrated.no_tables(alias) from error

    return publish_or_name_migrate  # type: ignore[return-value]


def _retry_alone(connection: BaseDatabaseWrapper, attempt: Callable[[], _Sent]) -> _Sent:
    """Outside a transaction of the caller's, a publish is its own transaction: when the
    database rolls it back as a lock-wait or deadlock victim, nothing of it was stored,
    and trying again is safe. The next try finds what the winner stored (an id it
    published too comes back ``created=False``). Inside the caller's transaction the
    whole transaction was rolled back: the error is the caller's to handle (retry the
    transaction)."""
    def is_victim(error: Exception) -> bool:
        return (isinstance(error, DatabaseError) and not connection.in_atomic_block
                and storage.store(connection).is_lock_wait(error))

    return retry_victims(attempt, tries=ALONE_TRIES, is_victim=is_victim,
                         pause=lambda tried: ALONE_FIRST_PAUSE * 2 ** (tried - 1),
                         sleep=RETRY_CLOCK.sleep)


def _alone_connection(using: str | None, topic: Any) -> BaseDatabaseWrapper | None:
    """The connection a publish will use, if it is outside the caller's transaction
    (None: inside one, or a bad topic or alias, which the publish itself reports)."""
    try:
        alias = using or get_settings().alias_for(topic)
        connection = connections[alias]
    except (ConnectionDoesNotExist, TypeError):
        return None
    return None if connection.in_atomic_block else connection


@_naming_migrate
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
    row = prepare_fields(topic, payload, partition_key, id, metadata, priority, delay,
                         deliver_at, conf, now_ms())
    connection = _connection(using, conf, topic)
    store = storage.store(connection)
    store.check_connection()  # a latin1 MySQL connection is refused before any write
    check_fits(store, row)
    if connection.in_atomic_block:
        return _store_one(connection, store, topic, row, conf)
    # Its own transaction: tried again if the database picks it as a deadlock victim,
    # with the same row (validated once; a victim stored nothing of it).
    return _retry_alone(connection, lambda: _store_one(connection, store, topic, row, conf))


def _store_one(connection: BaseDatabaseWrapper, store: Store, topic: str,
               row: MessageRow, conf: QueueSettings) -> SentMessage:
    """``send_message`` of a validated ``row``."""
    if row.fresh_id or conf.IDEMPOTENCY_WINDOW <= 0:
        # One INSERT (on PostgreSQL carrying the wake-up's NOTIFY).
        wake = notification_to_send(connection, store, topic, conf)
        sent = insert_one(connection, store, topic, row, wake, conf.PREPARED_PUBLISH)
        if sent.created:
            announce(connection, store, topic, conf, notified=wake is not None)
        return sent
    # An id of the caller's: remembered for IDEMPOTENCY_WINDOW, also once its message is
    # collected.
    return store_remembered_one(connection, store, topic, row, conf)


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
    trace_context = tracing.current_context()  # one span for the whole batch
    rows = [
        _prepare_item(topic, index, item, conf, published_at, trace_context)
        for index, item in enumerate(messages)
    ]
    if not rows:
        return []
    connection = _connection(using, conf, topic)
    store = storage.store(connection)
    store.check_connection()  # a latin1 MySQL connection is refused before any write
    for index, row in enumerate(rows):
        check_fits(store, row, f"message {index}: ")

    first_of_key: dict[tuple[str, str], MessageRow] = {}
    for row in rows:
        first_of_key.setdefault(row.key, row)
    unique_rows = list(first_of_key.values())
    offsets: dict[tuple[str, str], int] = {}
    created: set[tuple[str, str]] = set()
    chunks = list(message_chunks(unique_rows, store))
    window_ms = round(conf.IDEMPOTENCY_WINDOW * 1000)
    remembering = window_ms > 0 and any(not row.fresh_id for row in unique_rows)
    # One statement stores a chunk whole or not at all (a failed statement is undone on
    # its own), so a single chunk needs no transaction or savepoint of its own, unless the
    # ids of its messages are remembered too (a second statement).
    block: Any
    if len(chunks) > 1:
        block = transaction.atomic(using=connection.alias)
    else:
        block = together(connection) if remembering else nullcontext()
    with block:
        for chunk in chunks:
            if remembering:
                chunk_offsets, chunk_created = store_remembered_chunk(
                    connection, store, topic, chunk, window_ms)
            else:
                chunk_offsets, chunk_created = store_chunk(connection, store, topic, chunk)
            offsets.update(chunk_offsets)
            created.update(chunk_created)
        if created:
            announce(connection, store, topic, conf)

    results: list[SentMessage] = []
    for row in rows:
        first_time = row.key in created
        created.discard(row.key)  # a repeat within the batch is a dedup hit of the first
        results.append(
            SentMessage(topic, row.partition_key, row.id, offsets[row.key], created=first_time)
        )
    return results


send_messages = _naming_migrate(_retried_alone(send_messages))


def _prepare_item(
    topic: str, index: int, item: Any, conf: QueueSettings, published_at: int,
    trace_context: dict[str, str] | None,
) -> MessageRow:
    message = item if isinstance(item, OutgoingMessage) else OutgoingMessage(item)
    try:
        return prepare(topic, message, conf, published_at, trace_context)
    except InvalidMessage as exc:
        raise InvalidMessage(f"message {index}: {exc}") from exc


def _connection(using: str | None, conf: QueueSettings, topic: str) -> BaseDatabaseWrapper:
    """``using``, else the database ``SQLQUEUE["ROUTES"]`` sends ``topic`` to, else
    ``SQLQUEUE["DATABASE"]``."""
    alias = using or conf.alias_for(topic) or DEFAULT_DB_ALIAS
    try:
        return connections[alias]
    except ConnectionDoesNotExist as exc:
        raise InvalidMessage(f"using={alias!r} is not a database alias in DATABASES.") from exc
