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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import connections
from django.db.backends.utils import CursorWrapper

from sqlqueue import storage
from sqlqueue.conf import MAX_NAME_BYTES
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.naming import storable_text
from sqlqueue.storage.protocols import DeliveryStore
from sqlqueue.storage.sql.base import DeadLetterWrite, OutcomeWrite


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


@dataclass(frozen=True)
class DeliveredAck:
    """An atomic handler's ack of its own delivery: the message's ``attempt`` as that
    delivery's mark charged it."""

    partition_key: str
    offset: int
    attempt: int


class DeliveredAgain(SqlqueueError):
    """An atomic handler's transaction would ack a message delivered again since (past
    its visibility timeout, maybe dead-lettered so): it is rolled back."""


def ack_delivered(alias: str, group: str, topic: str, acks: Sequence[DeliveredAck]) -> None:
    """Ack ``acks`` in the caller's transaction on ``alias`` (an atomic handler's), each
    only while its delivery is the message's latest: its writes and its acks commit
    together, and never beside a later delivery's outcome (the dead letter of a
    redelivery out of attempts: guarantees I7 and I13). Raises ``DeliveredAgain`` (the
    caller's transaction rolls back) if any was delivered again. The statement waits
    for the locks of a pass that is marking the message again, and reads the row as
    that pass left it."""
    if not acks:
        return
    connection = connections[alias]
    with connection.cursor() as cursor:
        acked = storage.store(connection).ack_deliveries(cursor, group, topic, [
            (a.partition_key, a.offset, a.attempt - 1) for a in acks])
    if acked != len(acks):
        where = ", ".join(f"{topic}/{a.partition_key}@{a.offset} (attempt {a.attempt})"
                          for a in acks[:3])
        raise DeliveredAgain(
            f"{len(acks) - acked} of the {len(acks)} message(s) this atomic handler would "
            f"ack ({where}{', ...' if len(acks) > 3 else ''}) were delivered again past "
            "the visibility timeout (and maybe dead-lettered so): its transaction is rolled "
            "back, its writes with it.")


@dataclass(frozen=True)
class GiveBackOrder:
    """A delivery no handler started, to undo: its retry count back to
    ``previous_retry_count`` (None: never delivered before)."""

    partition_key: str
    offset: int
    previous_retry_count: int | None


def give_back(cursor: CursorWrapper, store: DeliveryStore, group: str, topic: str,
              orders: Iterable[GiveBackOrder]) -> None:
    """Undo the deliveries of messages no handler started: no attempt charged, visible
    again now; one statement per distinct previous retry count (usually one or two),
    none for nothing."""
    by_count: dict[int | None, list[tuple[str, int]]] = {}
    for order in orders:
        by_count.setdefault(order.previous_retry_count, []).append(
            (order.partition_key, order.offset))
    for previous, keys in by_count.items():
        store.give_back(cursor, group, topic, keys, previous)


def dead_letter_id(original_id: str, group: str) -> str:
    """The id of a group's dead letter: unique per (message id, group) in the dead-letter
    topic, so two groups can dead-letter the same message (guarantee I6)."""
    candidate = f"{original_id}@{group}"
    if len(candidate.encode("utf-8")) <= MAX_NAME_BYTES:
        return candidate
    return "sha256:" + hashlib.sha256(f"{original_id}\x00{group}".encode()).hexdigest()


@dataclass(frozen=True)
class DeadLetterCopy:
    """A message to copy into its dead-letter topic for a group (``copy_to_dead_letters``)."""

    message_id: str
    offset: int
    attempts: int
    error: str
    reason: str


def copy_to_dead_letters(cursor: CursorWrapper, store: DeliveryStore, *, dead_letter_topic: str,
                         group: str, copies: Sequence[DeadLetterCopy]) -> None:
    """Copy messages into their dead-letter topic for ``group``, a few statements for any
    number (the caller acks them, with ``write_acks``, in the same transaction), each
    error made safe to store (guarantee I15)."""
    store.insert_dead_letters(cursor, dead_letter_topic=dead_letter_topic, group=group, letters=[
        DeadLetterWrite(
            offset=copy.offset, dead_letter_id=dead_letter_id(copy.message_id, group),
            attempts=copy.attempts, last_error=storable_text(copy.error),
            detail=json.dumps({"id": storable_text(copy.message_id), "offset": copy.offset,
                               "group": group, "reason": copy.reason}))
        for copy in copies])
