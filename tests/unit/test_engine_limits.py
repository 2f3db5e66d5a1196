"""A consumer's limits (``rate_limit``, ``max_in_flight``) on the stepped engine
(tests/engine): their clock is the runner's host clock, so a manual clock steps them as
it steps leases and timeouts (before issue 54 ``Limits`` read ``time.monotonic`` bound at
import, and no stepped test could reach them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqlqueue import Message, send_message
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from tests.engine.harness import ALIASES, MemoryQueue, memory_queue

TOPIC = "limits.t"
STEP_MS = 50


@pytest.fixture
def queue() -> Iterator[MemoryQueue]:
    with memory_queue() as q:
        yield q
    unregister("g", TOPIC)


def started_at(queue: MemoryQueue, **limits: float) -> list[int]:
    """Register ``g`` with ``limits``, publish 20 messages on 4 partitions, step one
    runner every STEP_MS until all ran: the clock ms at which each handler started."""
    starts: list[int] = []

    def handle(message: Message) -> None:
        starts.append(queue.clock.ms)

    consumer(TOPIC, group="g", **limits)(handle)  # type: ignore[arg-type]
    for n in range(20):
        send_message(TOPIC, n, partition_key=f"p{n % 4}", using=ALIASES[0])
    runner = queue.runner(select_consumers(["g"], [TOPIC]))
    for _ in range(400):
        if len(starts) == 20:
            break
        runner.step()
        queue.clock.advance(STEP_MS)
    assert len(starts) == 20
    return starts


def test_a_rate_limit_is_stepped_on_the_manual_clock(queue: MemoryQueue) -> None:
    starts = started_at(queue, rate_limit=5.0)
    first = starts[0]
    # A burst of at most 2 (the bucket's capacity at 5/s), then 5 a second: by t ms
    # after the first start, at most 2 + 5 * t / 1000 have started.
    for n, at in enumerate(starts, start=1):
        assert n <= 2 + 5 * (at - first) / 1000 + 1e-9, (n, at - first)
    # ...and the limit held them back: 20 messages took about (20 - 2) / 5 s of the
    # manual clock, where without it they all start within a few steps.
    assert starts[-1] - first >= 3_000


def test_without_limits_the_same_messages_start_at_once(queue: MemoryQueue) -> None:
    starts = started_at(queue)
    assert starts[-1] - starts[0] <= 5 * STEP_MS


def test_max_in_flight_bounds_what_a_pass_hands_out(queue: MemoryQueue) -> None:
    ran: list[int] = []
    consumer(TOPIC, group="g", max_in_flight=2)(lambda message: None)
    for n in range(12):
        send_message(TOPIC, n, partition_key=f"p{n % 4}", using=ALIASES[0])
    runner = queue.runner(select_consumers(["g"], [TOPIC]))
    for _ in range(100):
        ran.append(runner.step())  # handlers of one pass; their outcomes: the next pass
        queue.clock.advance(STEP_MS)
        if sum(ran) == 12:
            break
    assert sum(ran) == 12
    assert max(ran) == 2  # never more than max_in_flight outstanding at once
