"""``@consumer(rate_limit=..., max_in_flight=...)`` in one process (#17); across processes:
tests/acceptance/test_limits.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sqlqueue import Message, OutgoingMessage, send_messages
from sqlqueue.models import DeliveryState
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def test_max_in_flight_holds_back_messages_unmarked_and_uncharged(register: Any) -> None:
    lock = threading.Lock()
    running: list[int] = []
    most = 0
    marked_while_running: list[int] = []
    attempts: list[int] = []

    def slow(message: Message) -> None:
        nonlocal most
        with lock:
            running.append(message.offset)
            most = max(most, len(running))
        # Held-back messages are not marked delivered: only the running ones have a
        # delivery state row (read on this thread's own connection).
        marked_while_running.append(DeliveryState.objects.filter(acked=False).count())
        attempts.append(message.attempt)
        time.sleep(0.05)
        with lock:
            running.remove(message.offset)

    register("t", "g", slow, max_in_flight=2)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 3}") for n in range(12)])
    runner = drain(["g"], threads=6)
    assert runner.stats["ack"] == 12
    assert most == 2
    assert max(marked_while_running) <= 2
    assert attempts == [1] * 12  # none was charged an attempt while held back


def test_rate_limit_in_one_process(register: Any) -> None:
    starts: list[float] = []
    register("t", "g", lambda message: starts.append(time.monotonic()), rate_limit=20)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 4}") for n in range(41)])
    drain(["g"], threads=4)
    assert len(starts) == 41
    took = starts[-1] - starts[0]
    # 40 intervals at 20/s: 2 s, less the small initial burst; never sooner (a loaded
    # machine only makes it later: how much later is the benchmarks' business).
    assert took >= 1.7, f"41 messages at 20/s took {took:.2f}s"
