"""A flood does not starve the healthy (sqlqueue.consuming.fairness): when a partition
counts as failing, how its deliveries take their place in the handler pool's queue, and
that they take at most half of the handler threads. No database: deliveries made by hand, and
a pool of real threads whose handlers wait on events (never on a clock)."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from sqlqueue import Message
from sqlqueue.consuming.batches import Batch
from sqlqueue.consuming.fairness import YIELD_SECONDS, FailingRuns, yields
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.handoff import HandlerPool
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.ledger import FAILING_AFTER, FailingPartitions
from sqlqueue.consuming.registry import Consumer
from sqlqueue.wakeups import Doorbell
from tests.unit.test_batch_units import row

pytestmark = pytest.mark.unit

WAIT = 10.0  # the longest a condition may take to hold before the test fails


def delivery(key: str, offset: int, *, consumer: Consumer | None = None, priority: int = 0,
             place: float = 0.0, failing: bool = False) -> Delivery:
    made = Delivery(consumer or Consumer("t", "g", print), "default", key,
                    row(offset, priority=priority), 1, offset)
    made.yields, made.place = failing, place + (YIELD_SECONDS if failing else 0.0)
    return made


def outcomes(kinds: list[str], key: str = "p") -> list[Outcome]:
    return [Outcome(delivery(key, n), kind) for n, kind in enumerate(kinds)]  # type: ignore[arg-type]


# -- when a partition counts as failing ----------------------------------------------------
def test_a_partition_fails_after_runs_in_a_row_that_all_failed() -> None:
    failing = FailingPartitions()
    failing.ran(outcomes(["fail", "retry"][: FAILING_AFTER - 1]))
    assert not failing.failing("p")
    failing.ran(outcomes(["reject"]))
    assert failing.failing("p") and not failing.failing("other")


def test_one_ack_makes_it_healthy_and_a_give_back_counts_for_nothing() -> None:
    failing = FailingPartitions()
    failing.ran(outcomes(["fail"] * FAILING_AFTER + ["not_started"]))
    assert failing.failing("p")
    failing.ran(outcomes(["acked"]))
    assert not failing.failing("p")
    failing.ran(outcomes(["fail"] * (FAILING_AFTER - 1) + ["ack", "fail"]))
    assert not failing.failing("p")


def test_partitions_no_longer_held_are_forgotten() -> None:
    failing = FailingPartitions()
    failing.ran(outcomes(["fail"] * FAILING_AFTER, "p") + outcomes(["fail"] * FAILING_AFTER, "q"))
    failing.keep_only(["q"])
    assert not failing.failing("p") and failing.failing("q")


# -- its place in the pool's queue -----------------------------------------------------------
def test_a_failing_delivery_goes_behind_healthy_ones_handed_out_within_the_yield() -> None:
    bad = delivery("bad", 1, place=100.0, failing=True)
    soon = delivery("ok", 2, place=100.0 + YIELD_SECONDS / 2)
    late = delivery("ok", 3, place=100.0 + 2 * YIELD_SECONDS)
    assert sorted([late, bad, soon], key=Delivery.sort_key) == [soon, bad, late]


def test_priority_still_goes_first() -> None:
    urgent_bad = delivery("bad", 1, priority=0, place=100.0, failing=True)
    healthy = delivery("ok", 2, priority=5, place=100.0)
    assert sorted([healthy, urgent_bad], key=Delivery.sort_key) == [urgent_bad, healthy]


def test_a_batch_yields_only_when_all_its_deliveries_do() -> None:
    bad = delivery("bad", 1, place=100.0, failing=True)
    ok = delivery("ok", 2, place=100.0)
    assert yields(Batch([bad, delivery("bad", 3, failing=True)]))
    assert not yields(Batch([bad, ok]))
    assert Batch([bad, ok]).sort_key() == ok.sort_key()  # it goes as its healthy one


# -- half of the handler threads ------------------------------------------------------------
def test_failing_runs_leave_half_the_threads_to_the_healthy() -> None:
    runs = FailingRuns(threads=5)
    first, second, third = (delivery("bad", n, failing=True) for n in (1, 2, 3))
    assert runs.start(first.sort_key(), first) and runs.start(second.sort_key(), second)
    assert not runs.start(third.sort_key(), third)  # held
    healthy = delivery("ok", 4)
    assert runs.start(healthy.sort_key(), healthy)  # the healthy are never held
    assert runs.ended(healthy) is None
    assert runs.ended(first) == (third.sort_key(), third)  # back to the queue
    assert runs.ended(first) is None  # a timed-out run ends once
    assert runs.release() == []


def test_with_one_thread_a_failing_run_may_take_it() -> None:
    runs = FailingRuns(threads=1)
    bad = delivery("bad", 1, failing=True)
    assert runs.start(bad.sort_key(), bad)


def test_the_held_are_released_at_shutdown() -> None:
    runs = FailingRuns(threads=2)
    first, second = delivery("bad", 1, failing=True), delivery("bad", 2, failing=True)
    runs.start(first.sort_key(), first)
    runs.start(second.sort_key(), second)
    assert runs.release() == [second]


class Downstream:
    """A handler whose "bad" messages wait until the downstream answers, then fail."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.started: queue.SimpleQueue[int] = queue.SimpleQueue()

    def __call__(self, message: Message) -> None:
        self.started.put(message.offset)
        if message.partition_key == "bad":
            self.answer.wait(WAIT)
            raise RuntimeError("the downstream service is down")


def pool(threads: int) -> HandlerPool:
    return HandlerPool(name="unit", threads=threads, alias="default",
                       instruments=Instruments(), stopping=threading.Event(),
                       wakeup=Doorbell(0.0), paused=lambda group, topic: False,
                       exit_when_stuck=None, on_stuck=lambda: None)


def test_a_healthy_message_waits_for_no_failing_run() -> None:
    downstream = Downstream()
    consumer = Consumer("t", "g", downstream)
    handlers = pool(threads=2)
    # The second failing delivery is ahead of the healthy one in the queue (handed out
    # long before it): the free thread holds it, and runs the healthy one.
    made: list[Any] = [delivery("bad", 1, consumer=consumer, place=0.0, failing=True),
                       delivery("bad", 2, consumer=consumer, place=1.0, failing=True),
                       delivery("ok", 3, consumer=consumer, place=10 * YIELD_SECONDS)]
    handlers.start()
    try:
        handlers.dispatch(made[:1])
        assert downstream.started.get(timeout=WAIT) == 1  # the downstream holds it
        handlers.dispatch(made[1:])
        assert downstream.started.get(timeout=WAIT) == 3  # not 2: held
        assert handlers.done.get(timeout=WAIT).kind == "ack"
        downstream.answer.set()
        assert downstream.started.get(timeout=WAIT) == 2  # once the first one ended
        kinds = sorted(handlers.done.get(timeout=WAIT).kind for _ in range(2))
        assert kinds == ["fail", "fail"]
    finally:
        downstream.answer.set()
        handlers.stop_threads()
