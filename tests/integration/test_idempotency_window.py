"""``IDEMPOTENCY_WINDOW`` (SPEC §9, issue 13): an id published again into the same
(topic, partition_key) within the window is absorbed, also after its message was consumed
and garbage-collected; after the window it is accepted again."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import sqlqueue
from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.models import IdempotencyKey, QueueMessage
from sqlqueue.publishing.messages import idempotency_digest
from tests.integration.consuming_helpers import drain_until_watermarks, fast_settings, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]
TOPIC = "orders.created"


def consume_and_collect(group: str, last: dict[str, int]) -> int:
    """Let ``group`` finish everything up to ``last`` (partition -> offset), then collect
    with the default RETENTION = 0; returns the messages deleted."""
    keep = fast_settings(RETENTION=3600)  # the runners must not collect on their own here
    drain_until_watermarks(group, last, conf=keep)
    collector = GarbageCollector(fast_settings(), "default", {TOPIC: {group}})
    with connection.cursor() as cursor:
        collector.collect(cursor, force=True)
    return collector.deleted


def expire_window() -> None:
    """As if IDEMPOTENCY_WINDOW had passed for every key (the database's clock decides)."""
    IdempotencyKey.objects.update(expires_at=1)


def test_a_resend_after_consumption_and_gc_is_absorbed(register: Any) -> None:
    handled: list[str] = []
    register(TOPIC, "billing", lambda m: handled.append(m.id))
    first = send_message(TOPIC, {"total": 10}, partition_key="customer-alice", id="order-1")
    assert consume_and_collect("billing", {"customer-alice": first.offset}) == 1
    assert not QueueMessage.objects.filter(topic=TOPIC).exists()

    again = send_message(TOPIC, {"total": 10}, partition_key="customer-alice", id="order-1")
    assert (again.created, again.offset) == (False, first.offset)
    batch = send_messages(TOPIC, [
        OutgoingMessage({"total": 10}, partition_key="customer-alice", id="order-1"),
        OutgoingMessage({"total": 20}, partition_key="customer-alice", id="order-2"),
    ])
    assert [(s.created, s.id) for s in batch] == [(False, "order-1"), (True, "order-2")]
    assert batch[0].offset == first.offset
    assert list(QueueMessage.objects.filter(topic=TOPIC).values_list("id", flat=True)) == [
        "order-2"]
    assert handled == ["order-1"]  # billing charged order 1 once


def test_the_same_id_in_another_partition_or_topic_is_another_message() -> None:
    first = send_message(TOPIC, {}, partition_key="a", id="order-1")
    QueueMessage.objects.filter(offset=first.offset).delete()  # as if collected
    assert send_message(TOPIC, {}, partition_key="b", id="order-1").created
    assert send_message("orders.updated", {}, partition_key="a", id="order-1").created
    assert not send_message(TOPIC, {}, partition_key="a", id="order-1").created


def test_after_the_window_the_id_is_accepted_again(register: Any) -> None:
    register(TOPIC, "billing", lambda m: None)
    send_message(TOPIC, {}, partition_key="k", id="order-1")
    second = send_messages(TOPIC, [OutgoingMessage({}, partition_key="k", id="order-2")])[0]
    consume_and_collect("billing", {"k": second.offset})
    expire_window()
    # An expired key no longer absorbs, even before garbage collection removes it ...
    again = send_message(TOPIC, {}, partition_key="k", id="order-1")
    assert again.created and again.offset > second.offset
    # ... and a new window starts from this publish.
    assert IdempotencyKey.objects.get(message_offset=again.offset).expires_at > 1
    collector = GarbageCollector(fast_settings(), "default", {})
    with connection.cursor() as cursor:
        collector.collect(cursor, force=True)
    assert collector.keys_deleted == 1  # order-2's key, past its window
    assert send_messages(TOPIC, [OutgoingMessage({}, partition_key="k", id="order-2")])[0].created


def test_an_id_still_stored_is_absorbed_whatever_the_window() -> None:
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 0}):
        first = send_message(TOPIC, {}, partition_key="k", id="x")
        assert not send_message(TOPIC, {}, partition_key="k", id="x").created
        assert not IdempotencyKey.objects.exists()  # window 0: nothing remembered
        QueueMessage.objects.filter(offset=first.offset).delete()
        assert send_message(TOPIC, {}, partition_key="k", id="x").created


def test_only_ids_of_the_callers_are_remembered_with_the_window() -> None:
    send_message(TOPIC, {})  # sqlqueue's own UUID: nobody can send it "again" by mistake
    send_messages(TOPIC, [1, 2, 3])
    assert not IdempotencyKey.objects.exists()
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 3600}):
        sent = send_message(TOPIC, {}, partition_key="k", id="order-9")
    key = IdempotencyKey.objects.get()
    assert (key.key_high, key.key_low) == idempotency_digest(TOPIC, "k", "order-9")
    assert key.message_offset == sent.offset
    with connection.cursor() as cursor:
        cursor.execute("SELECT expires_at - created_at FROM queue_idempotency_keys k JOIN "
                       "queue_messages m ON m.`offset` = k.message_offset"
                       if connection.vendor == "mysql" else
                       'SELECT expires_at - created_at FROM queue_idempotency_keys k JOIN '
                       'queue_messages m ON m."offset" = k.message_offset')
        (window_ms,) = cursor.fetchone()
    assert 3_590_000 <= window_ms <= 3_610_000  # database clock + 1 hour


def test_a_rolled_back_publish_remembers_nothing() -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        send_message(TOPIC, {}, partition_key="k", id="order-1")
        raise RuntimeError("the caller's transaction fails")
    assert not IdempotencyKey.objects.exists()
    assert send_message(TOPIC, {}, partition_key="k", id="order-1").created


def test_a_failing_handler_does_not_matter_to_the_window(register: Any) -> None:
    """The window counts from the publish, whatever the consumers did with it."""
    register(TOPIC, "billing", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")))
    first = send_message(TOPIC, {}, partition_key="k", id="order-1")
    consume_and_collect("billing", {"k": first.offset})
    assert not send_message(TOPIC, {}, partition_key="k", id="order-1").created


@pytest.mark.parametrize("in_callers_transaction", [False, True])
def test_a_key_that_cannot_be_written_takes_its_message_with_it(
    monkeypatch: pytest.MonkeyPatch, in_callers_transaction: bool,
) -> None:
    from django.db import OperationalError, transaction

    from sqlqueue.storage.sql import store_for

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("lock wait timeout (simulated)")

    monkeypatch.setattr(type(store_for(connection)), "remember_idempotency_keys", fail)
    publishes = (lambda: send_message(TOPIC, {}, partition_key="k", id="order-1"),
                 lambda: send_messages(TOPIC, [OutgoingMessage({}, partition_key="k",
                                                               id="order-2")]))
    for publish in publishes:
        if in_callers_transaction:
            # A caller that swallows the error and carries on cannot commit the message
            # without its key: Django rolls its transaction back.
            with transaction.atomic(), pytest.raises(OperationalError):
                publish()
        else:
            with pytest.raises(OperationalError):
                publish()
    assert not QueueMessage.objects.filter(topic=TOPIC).exists()
