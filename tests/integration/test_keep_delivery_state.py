"""SQLQUEUE['KEEP_DELIVERY_STATE']: delivery state (ack times, attempts) kept for the
analytics report until garbage collection deletes the message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.db import connection

import sqlqueue
from sqlqueue import Message, send_messages
from sqlqueue.conf import validate
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.models import DeliveryState, QueueMessage
from tests.integration.consuming_helpers import drain_until_watermarks, fast_settings, register

__all__ = ["register"]


def test_the_setting_is_a_boolean() -> None:
    conf, problems = validate({"KEEP_DELIVERY_STATE": True})
    assert conf is not None and conf.KEEP_DELIVERY_STATE is True
    assert validate({})[0].KEEP_DELIVERY_STATE is False  # type: ignore[union-attr]
    conf, problems = validate({"KEEP_DELIVERY_STATE": "yes"})
    assert conf is None and problems[0].id == "sqlqueue.E003"


def consume(register: Any, keep: bool) -> list[int]:
    failed: set[str] = set()

    def flaky(message: Message) -> None:
        if message.payload == 2 and message.id not in failed:
            failed.add(message.id)
            raise RuntimeError("first attempt fails")

    register("t", "billing", flaky)
    sent = send_messages("t", [sqlqueue.OutgoingMessage(n, partition_key="k") for n in range(4)])
    conf = fast_settings(KEEP_DELIVERY_STATE=keep, RETENTION=3600)
    drain_until_watermarks("billing", {"k": sent[-1].offset}, conf=conf)
    return [s.offset for s in sent]


@pytest.mark.django_db(transaction=True)
def test_without_it_state_goes_when_the_watermark_passes(register: Any) -> None:
    consume(register, keep=False)
    assert not DeliveryState.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_it_acked_state_stays_until_gc_deletes_the_message(register: Any) -> None:
    offsets = consume(register, keep=True)
    states = {s.message_offset: s for s in DeliveryState.objects.filter(consumer_group="billing")}
    assert sorted(states) == offsets
    assert all(s.acked and s.acked_at > 0 for s in states.values())
    assert [states[o].retry_count for o in offsets] == [0, 0, 1, 0]

    conf = dataclasses.replace(fast_settings(), KEEP_DELIVERY_STATE=True)
    with connection.cursor() as cursor:
        GarbageCollector(conf, "default", {"t": {"billing"}}).collect(cursor, force=True)
    assert not QueueMessage.objects.filter(topic="t").exists()
    assert not DeliveryState.objects.exists()
