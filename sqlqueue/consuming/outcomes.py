"""Writing what became of deliveries: the one place acks, retries and give-backs reach
delivery state, and dead letters are copied.

Every ack goes through ``write_acks`` (the subscriber's recorded outcomes and dead
letters, an atomic handler's ack, a task's, an operator's cancel), and every give-back
through ``give_back``: nothing else calls ``Store.write_outcomes`` or
``Store.give_back`` (tests/unit/test_one_writer.py reads the source to hold it so).
What to write is decided elsewhere (sqlqueue.consuming.recording, no database).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections
from django.db.backends.utils import CursorWrapper

from sqlqueue import storage
from sqlqueue.conf import MAX_NAME_BYTES
from sqlqueue.naming import storable_text
from sqlqueue.storage.protocols import DeliveryStore
from sqlqueue.storage.sql.base import OutcomeWrite


@dataclass(frozen=True)
class Ack:
    """A message done for a group: handled, dead-lettered or cancelled."""

    partition_key: str
    offset: int


@dataclass(frozen=True)
class RetryAt:
    """A message to deliver again, not before ``invisible_until`` (database time)."""

    partition_key: str
    offset: int
    invisible_until: int
    error: str


def write_acks(cursor: CursorWrapper, store: DeliveryStore, group: str, topic: str,
               acks: Iterable[Ack], retries: Iterable[RetryAt] = ()) -> None:
    """Ack ``acks`` for ``group`` (an acked row stays acked), and schedule ``retries``
    with them: one statement, none at all for nothing. Error texts are stored made safe
    (``storable_text``): whatever a handler raised, its outcome is written (guarantee I15)."""
    store.write_outcomes(cursor, group, topic, [
        *(OutcomeWrite(a.partition_key, a.offset, acked=True, invisible_until=0)
          for a in acks),
        *(OutcomeWrite(r.partition_key, r.offset, acked=False,
                       invisible_until=r.invisible_until,
                       last_error=storable_text(r.error))
          for r in retries),
    ])


def ack(alias: str, group: str, topic: str, partition_key: str, offset: int) -> None:
    """Ack one message in the caller's transaction on ``alias``: its ack commits with the
    handler's (or task's) own writes, or not at all (guarantee I13)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        write_acks(cursor, storage.store(connection), group, topic, [Ack(partition_key, offset)])


def give_back(cursor: CursorWrapper, store: DeliveryStore, group: str, topic: str,
              partition_key: str, offset: int, previous_retry_count: int | None) -> None:
    """Undo the delivery of a message no handler started: no attempt charged (its retry
    count back to ``previous_retry_count``; None: never delivered), visible again now."""
    store.give_back(cursor, group, topic, partition_key, offset, previous_retry_count)


def dead_letter_id(original_id: str, group: str) -> str:
    """The id of a group's dead letter: unique per (message id, group) in the dead-letter
    topic, so two groups can dead-letter the same message (guarantee I6)."""
    candidate = f"{original_id}@{group}"
    if len(candidate.encode("utf-8")) <= MAX_NAME_BYTES:
        return candidate
    return "sha256:" + hashlib.sha256(f"{original_id}\x00{group}".encode()).hexdigest()


def copy_to_dead_letters(cursor: CursorWrapper, store: DeliveryStore, *, dead_letter_topic: str,
                         group: str, message_id: str, offset: int, attempts: int,
                         error: str, reason: str) -> None:
    """Copy a message into its dead-letter topic for ``group`` (the caller acks it, with
    ``write_acks``, in the same transaction), with its error made safe to store."""
    store.insert_dead_letter(
        cursor, dead_letter_topic=dead_letter_topic,
        dead_letter_id=dead_letter_id(message_id, group), offset=offset, attempts=attempts,
        last_error=storable_text(error),
        detail=json.dumps({"id": storable_text(message_id), "offset": offset, "group": group,
                           "reason": reason}),
        group=group,
    )
