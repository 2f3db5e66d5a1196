"""``@consumer(timeout=...)``: a handler past it counts as failed and is retried (#17)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sqlqueue import Message, OutgoingMessage, send_messages
from sqlqueue.consuming.registry import consumer
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.models import DeliveryState
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def test_a_handler_past_its_timeout_is_retried_and_its_slot_replaced(register: Any) -> None:
    calls: list[tuple[int, int, float]] = []
    release = threading.Event()

    def slow_first(message: Message) -> None:
        calls.append((message.payload, message.attempt, time.monotonic()))
        if message.payload == 0 and message.attempt == 1:
            release.wait(10)  # stuck far past the timeout

    register("t", "g", slow_first, timeout=1.0, max_attempts=3)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(2)])
    started = time.monotonic()
    runner = drain(["g"], threads=1)
    took = time.monotonic() - started
    release.set()
    # The stuck first attempt counted as failed; the retry ran and acked, and message 1
    # ran although the only handler thread was stuck (a new thread took its place).
    assert sorted((p, a) for p, a, _ in calls) == [(0, 1), (0, 2), (1, 1)]
    assert runner.stats["fail"] == 1 and runner.stats["ack"] == 2
    assert took < 8, f"drained in {took:.1f}s: the stuck handler held things up"
    assert DeliveryState.objects.filter(acked=False).count() == 0


def test_bad_timeouts_are_refused() -> None:
    for bad in (0, -1, "5", True, float("inf")):
        with pytest.raises(ConfigurationError, match="timeout is a positive number"):
            consumer("t", group="g", timeout=bad)  # type: ignore[arg-type]
