"""Cancelling pending messages of one consumer group, by id or by filter (#17).

A cancelled message is settled for that group without running: its delivery state is
acked, and a copy is kept in the dead-letter topic with the reason ``cancelled`` (so the
admin's dead-letter pages show it as cancelled, ``replay`` undoes a mistaken cancel and
``discard`` forgets it). Other groups still receive it (guarantee I6).

Like the position repairs (sqlqueue.operations.positions), each partition touched has its
lease revoked in the same transaction, so a running subscriber that had already fetched
the message drops what it holds in memory and reads the cancellation back: the message is
never started after the cancel commits. A message whose first attempt is running right
now is not pending, and is left alone (it is reported as skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.consuming.outcomes import Ack, DeadLetterCopy, copy_to_dead_letters, write_acks
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.operations.lag import known_subscriptions
from sqlqueue.operations.positions import _now_ms, _revoke_lease

CANCEL_BATCH = 1000
CANCELLED = "cancelled"


class InvalidCancel(SqlqueueError, ValueError):
    """A cancel that names no group, no message, or nothing to select them by."""


@dataclass
class Cancelled:
    cancelled: int = 0
    skipped: int = 0  # running now, or already done

    def describe(self, group: str, topic: str) -> str:
        text = f"Cancelled {self.cancelled} pending message(s) of {group} on {topic}."
        if self.skipped:
            text += f" {self.skipped} were running or already done, and were left alone."
        return text


def cancel_messages(group: str, topic: str, *, ids: Sequence[str] | None = None,
                    offsets: Sequence[int] | None = None,
                    partition_key: str | None = None, upto_offset: int | None = None,
                    reason: str = "", using: str | None = None,
                    on_progress: Callable[[int], None] | None = None) -> Cancelled:
    """Cancel ``group``'s pending messages of ``topic`` with one of ``ids``, and/or in
    ``partition_key``, and/or at offsets <= ``upto_offset``, and/or at one of
    ``offsets`` (the admin's selection)."""
    alias = using or get_settings().DATABASE
    if (group, topic) not in known_subscriptions(alias):
        raise InvalidCancel(f"No consumer group {group!r} on topic {topic!r}.")
    if not ids and not offsets and partition_key is None and upto_offset is None:
        raise InvalidCancel("Select the messages to cancel: ids, a partition key or an "
                            "offset bound (cancelling everything is not supported).")
    if upto_offset is not None and (isinstance(upto_offset, bool) or upto_offset < 1):
        raise InvalidCancel(f"upto_offset is an offset >= 1; got {upto_offset!r}.")
    rows = QueueMessage.objects.using(alias).filter(topic=topic,
                                                    consumer_group__in=["", group])
    if ids:
        rows = rows.filter(id__in=list(ids))
    if offsets:
        rows = rows.filter(offset__in=list(offsets))
    if partition_key is not None:
        rows = rows.filter(partition_key=partition_key)
    if upto_offset is not None:
        rows = rows.filter(offset__lte=upto_offset)
    marks = dict(PartitionOffset.objects.using(alias).filter(consumer_group=group, topic=topic)
                 .values_list("partition_key", "offset_acked"))
    result = Cancelled()
    after = 0
    while True:
        batch = list(rows.filter(offset__gt=after).order_by("offset")
                     .values_list("offset", "partition_key", "id")[:CANCEL_BATCH])
        if not batch:
            return result
        after = batch[-1][0]
        by_partition: dict[str, list[tuple[int, str]]] = {}
        for offset, key, message_id in batch:
            if offset > marks.get(key, 0):
                by_partition.setdefault(key, []).append((offset, message_id))
            else:
                result.skipped += 1
        for key, messages in sorted(by_partition.items()):
            _cancel_partition(alias, group, topic, key, messages, reason, result)
        if on_progress is not None:
            on_progress(result.cancelled)


def _cancel_partition(alias: str, group: str, topic: str, key: str,
                      messages: list[tuple[int, str]], reason: str, result: Cancelled) -> None:
    conf = get_settings()
    connection = connections[alias]
    store = storage.store(connection)
    with transaction.atomic(using=alias):
        _revoke_lease(alias, group, topic, key)  # waits for the holder's fenced write
        now = _now_ms(alias)
        states = {offset: (acked, until, error, retries) for offset, acked, until, error, retries
                  in DeliveryState.objects.using(alias).filter(
                      consumer_group=group, topic=topic, partition_key=key,
                      message_offset__in=[o for o, _ in messages])
                  .values_list("message_offset", "acked", "invisible_until", "last_error",
                               "retry_count")}
        chosen = []
        for offset, message_id in messages:
            acked, until, error, retries = states.get(offset, (False, 0, "", 0))
            if acked or (until > now and not error):  # done, or its first attempt runs
                result.skipped += 1
                continue
            chosen.append((offset, message_id, retries))
        with connection.cursor() as cursor:
            copy_to_dead_letters(
                cursor, store, dead_letter_topic=topic + conf.DLQ_SUFFIX, group=group,
                copies=[DeadLetterCopy(message_id=message_id, offset=offset, attempts=retries,
                                       error=f"Cancelled by an operator. {reason}".strip(),
                                       reason=CANCELLED)
                        for offset, message_id, retries in chosen])
            write_acks(cursor, store, group, topic, [Ack(key, offset) for offset, _, _ in chosen])
        result.cancelled += len(chosen)
