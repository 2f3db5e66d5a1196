"""``@consumer(timeout=...)``: a handler past it counts as failed and is retried (#17)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sqlqueue import Message, OutgoingMessage, send_messages
from sqlqueue.consuming.registry import consumer
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.models import DeliveryState
from tests.integration.consuming_helpers import RUN_TIMEOUT, drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def test_a_handler_past_its_timeout_is_retried_and_its_slot_replaced(register: Any) -> None:
    calls: list[tuple[int, int]] = []
    release, stuck_returned = threading.Event(), threading.Event()

    def slow_first(message: Message) -> None:
        calls.append((message.payload, message.attempt))
        if message.payload == 0 and message.attempt == 1:
            # Stuck past the drain's own bound (RUN_TIMEOUT): a drain that waited for it
            # would fail there, whatever the machine's speed.
            release.wait(2 * RUN_TIMEOUT)
            stuck_returned.set()

    register("t", "g", slow_first, timeout=1.0, max_attempts=3)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(2)])
    try:
        runner = drain(["g"], threads=1)
        # The drain ended while the first attempt was still stuck: nothing waited for it.
        assert not stuck_returned.is_set(), "the stuck handler held the drain up"
    finally:
        release.set()
    # The stuck first attempt counted as failed; the retry ran and acked, and message 1
    # ran although the only handler thread was stuck (a new thread took its place).
    assert sorted(calls) == [(0, 1), (0, 2), (1, 1)]
    assert runner.stats["fail"] == 1 and runner.stats["ack"] == 2
    assert DeliveryState.objects.filter(acked=False).count() == 0


def test_bad_timeouts_are_refused() -> None:
    for bad in (0, -1, "5", True, float("inf")):
        with pytest.raises(ConfigurationError, match="timeout is a positive number"):
            consumer("t", group="g", timeout=bad)  # type: ignore[arg-type]
