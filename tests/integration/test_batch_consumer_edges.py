"""Batch consumers' edges: ``max_wait`` (a batch filled across passes, one not full handed
out after the wait), ``max_in_flight`` and ``rate_limit`` counted in messages, the
``timeout`` of a whole call, the batch-size histogram, and ``sqlqueue.testing``'s
``run_consumers`` (counts per message). Run on SQLite, MariaDB/MySQL and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

import sqlqueue
from sqlqueue import Message, OutgoingMessage, send_messages
from sqlqueue.consuming.limits import BURST_SECONDS
from sqlqueue.consuming.registry import select_consumers, unregister
from sqlqueue.consuming.runner import Runner
from sqlqueue.metrics import ProcessMetrics
from sqlqueue.testing import RunReport, run_consumers
from tests.integration.consuming_helpers import drain, fast_settings, run_until
from tests.integration.test_process_metrics import samples


@pytest.fixture
def batch() -> Iterator[Callable[..., Any]]:
    added: list[tuple[str, str]] = []

    def add(topic: str, group: str, handler: Any, **options: Any) -> Any:
        sqlqueue.batch_consumer(topic, group=group, **options)(handler)
        added.append((group, topic))
        return handler

    yield add
    for group, topic in added:
        unregister(group, topic)


def publish(topic: str, first: int, count: int, partitions: int = 1) -> None:
    send_messages(topic, [OutgoingMessage({"n": n}, partition_key=f"p{n % partitions}")
                          for n in range(first, first + count)])


def numbers(messages: list[Message]) -> list[int]:
    return [m.payload["n"] for m in messages]


@pytest.mark.django_db(transaction=True)
def test_max_wait_fills_a_batch_across_passes(batch: Any) -> None:
    """Three messages, then three more: one call of six (max_batch 6), although the
    runner's passes handed them out three at a time; the wait (60 s) never ran out."""
    calls: list[list[int]] = []
    batch("e.fill", "g", lambda ms: calls.append(numbers(ms)), max_batch=6, max_wait=60)
    runner = Runner(select_consumers(["g"]), conf=fast_settings())
    runner.start_handler_threads()
    try:
        publish("e.fill", 0, 3)
        run_until(runner, lambda: runner.pool.dispatched == 3)
        assert calls == [] and runner.pool.next_filled_in() is not None  # held
        publish("e.fill", 3, 3)
        run_until(runner, lambda: bool(calls))
        assert calls == [[0, 1, 2, 3, 4, 5]]
        assert runner.pool.next_filled_in() is None
    finally:
        runner.stop()
        runner.shutdown()


@pytest.mark.django_db(transaction=True)
def test_a_batch_not_full_is_handed_out_after_max_wait(batch: Any) -> None:
    calls: list[list[int]] = []
    batch("e.wait", "g", lambda ms: calls.append(numbers(ms)), max_batch=100,
          max_wait=0.05)
    publish("e.wait", 0, 3)
    drain(["g"])
    assert calls == [[0, 1, 2]]


@pytest.mark.django_db(transaction=True)
def test_a_held_batch_is_given_back_at_shutdown(batch: Any) -> None:
    calls: list[list[int]] = []
    batch("e.back", "g", lambda ms: calls.append(numbers(ms)), max_batch=10, max_wait=60)
    runner = Runner(select_consumers(["g"]), conf=fast_settings())
    runner.start_handler_threads()
    publish("e.back", 0, 2)
    run_until(runner, lambda: runner.pool.dispatched == 2)
    runner.stop()
    runner.shutdown()
    assert calls == [] and runner.pool.in_flight == 0
    # Given back, no attempt charged: the next runner delivers them as first attempts.
    attempts: list[int] = []
    batch("e.back", "g", lambda ms: attempts.extend(m.attempt for m in ms), max_batch=10)
    drain(["g"])
    assert attempts == [1, 1]


@pytest.mark.django_db(transaction=True)
def test_max_in_flight_counts_messages(batch: Any) -> None:
    sizes: list[int] = []
    lock = threading.Lock()

    def load(messages: list[Message]) -> None:
        with lock:
            sizes.append(len(messages))

    batch("e.flight", "g", load, max_batch=10, max_in_flight=3)
    publish("e.flight", 0, 12, partitions=2)
    drain(["g"])
    assert sum(sizes) == 12 and max(sizes) <= 3


@pytest.mark.django_db(transaction=True)
def test_rate_limit_counts_messages(batch: Any) -> None:
    """A rate limit of 1,000 messages a second holds at most 200 tokens (BURST_SECONDS of
    them): a batch is cut to what the limit allows, never one call for all 400."""
    sizes: list[int] = []
    batch("e.rate", "g", lambda ms: sizes.append(len(ms)), max_batch=400, rate_limit=1000)
    publish("e.rate", 0, 400)
    drain(["g"])
    assert sum(sizes) == 400 and max(sizes) <= 1000 * BURST_SECONDS


@pytest.mark.django_db(transaction=True)
def test_the_timeout_is_the_whole_calls(batch: Any) -> None:
    """A call past its timeout fails every message of it (retried); the next call, in
    time, acks them."""
    release = threading.Event()
    attempts: list[list[int]] = []

    def load(messages: list[Message]) -> None:
        attempts.append([m.attempt for m in messages])
        if messages[0].attempt == 1:
            release.wait(30)  # past the timeout: counted as failed meanwhile

    batch("e.slow", "g", load, max_batch=10, timeout=1.0)
    publish("e.slow", 0, 3)
    try:
        runner = drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0))
    finally:
        release.set()
    assert attempts[0] == [1, 1, 1]
    assert sorted(a for call in attempts[1:] for a in call) == [2, 2, 2]
    assert runner.subscribers[0].stats["retried"] == 3


@pytest.mark.django_db(transaction=True)
def test_the_batch_size_histogram(batch: Any) -> None:
    batch("e.hist", "g", lambda ms: None, max_batch=4)
    publish("e.hist", 0, 10)
    metrics = ProcessMetrics()
    drain(["g"], instruments=metrics, threads=1)
    s = samples(generate_latest(metrics.registry).decode())
    labels = (("group", "g"), ("topic", "e.hist"))
    assert s[("sqlqueue_batch_size_messages_sum", labels)] == 10
    calls = s[("sqlqueue_batch_size_messages_count", labels)]
    assert 3 <= calls <= 10
    at_most_five = [v for (name, found), v in s.items()
                    if name == "sqlqueue_batch_size_messages_bucket"
                    and dict(found).get("le") in ("5", "5.0") and dict(found)["topic"] == "e.hist"]
    assert at_most_five == [calls]  # max_batch 4: every call in the bucket up to 5


@pytest.mark.django_db
def test_run_consumers_counts_messages(batch: Any) -> None:
    def load(messages: list[Message]) -> dict[Message, BaseException]:
        return {m: ValueError("odd") for m in messages
                if m.payload["n"] % 2 and m.attempt == 1}

    batch("e.run", "g", load, max_batch=50, max_wait=60)  # no waiting in a test
    publish("e.run", 0, 6)
    report = run_consumers(group="g")
    assert report == RunReport(acked=3, retried=3)
    assert len(report.errors) == 3  # one per exception (a raise: one for the call)
