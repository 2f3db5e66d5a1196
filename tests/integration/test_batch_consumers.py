"""Batch consumers (``@sqlqueue.batch_consumer``, SPEC section 11): the handler gets a list
of messages; None acks them all, a mapping fails some, raising fails every one; ordered
batches stop at a failure (the rest given back, no attempt charged); atomic batches commit
their writes and acks together. Run by a real ``Runner`` (handler threads) on SQLite,
MariaDB/MySQL and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

import sqlqueue
from sqlqueue import Message, OutgoingMessage, Reject, Retry, send_messages
from sqlqueue.consuming.registry import unregister
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.testing import run_consumers
from tests.integration.consuming_helpers import drain, fast_settings

Handler = Callable[[list[Message]], Mapping[Message, BaseException] | None]


@pytest.fixture
def batch() -> Iterator[Callable[..., Handler]]:
    """Register a batch handler for one test: batch(topic, group, handler, **options)."""
    added: list[tuple[str, str]] = []

    def add(topic: str, group: str, handler: Handler, **options: Any) -> Handler:
        sqlqueue.batch_consumer(topic, group=group, **options)(handler)
        added.append((group, topic))
        return handler

    yield add
    for group, topic in added:
        unregister(group, topic)


def publish(topic: str, count: int, partitions: int = 1) -> None:
    send_messages(topic, [OutgoingMessage({"n": n}, partition_key=f"p{n % partitions}")
                          for n in range(count)])


def states(group: str) -> dict[int, DeliveryState]:
    return {s.message_offset: s for s in DeliveryState.objects.filter(consumer_group=group)}


def payloads(messages: list[Message]) -> list[int]:
    return [m.payload["n"] for m in messages]


def dead_letters(topic: str) -> list[QueueMessage]:
    return list(QueueMessage.objects.filter(topic=f"{topic}_dlq").order_by("offset"))


@pytest.mark.django_db(transaction=True)
def test_none_acks_every_message_and_batches_hold_at_most_max_batch(batch: Any) -> None:
    calls: list[list[int]] = []
    lock = threading.Lock()

    def load(messages: list[Message]) -> None:
        with lock:
            calls.append(payloads(messages))

    batch("b.all", "g", load, max_batch=7)
    publish("b.all", 40, partitions=3)
    runner = drain(["g"])
    handled = sorted(n for call in calls for n in call)
    assert handled == list(range(40))
    assert all(1 <= len(call) <= 7 for call in calls)
    assert len(calls) < 40  # batched, not one by one
    assert runner.subscribers[0].stats["acked"] == 40
    assert all(s.acked for s in states("g").values())


@pytest.mark.django_db(transaction=True)
def test_unordered_batches_mix_partitions(batch: Any) -> None:
    calls: list[set[str]] = []

    def load(messages: list[Message]) -> None:
        calls.append({m.partition_key for m in messages})

    batch("b.mix", "g", load, max_batch=50)
    publish("b.mix", 30, partitions=3)
    drain(["g"], threads=1)
    assert any(len(keys) > 1 for keys in calls)


@pytest.mark.django_db(transaction=True)
def test_a_mapping_fails_those_messages_as_a_single_consumer_would(batch: Any) -> None:
    seen: dict[int, int] = {}

    def load(messages: list[Message]) -> dict[Message, BaseException]:
        failures: dict[Message, BaseException] = {}
        for message in messages:
            n = message.payload["n"]
            seen[n] = message.attempt
            if n == 1:
                failures[message] = Reject("bad row")
            elif n == 2 and message.attempt == 1:
                failures[message] = Retry(delay=0)
            elif n == 3:
                failures[message] = ValueError("always")
        return failures

    batch("b.map", "g", load, max_batch=10, max_attempts=2)
    publish("b.map", 5)
    runner = drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0))
    dead = dead_letters("b.map")
    assert {json.loads(d.payload)["n"] for d in dead} == {1, 3}
    assert seen[2] == 2 and seen[3] == 2 and seen[1] == 1  # attempts counted
    reasons = {json.loads(d.payload)["n"]: d.failure_detail for d in dead}
    assert reasons[1]["reason"] == "rejected" and reasons[3]["reason"] == "max_attempts"
    stats = runner.subscribers[0].stats
    assert stats["acked"] == 3 and stats["dead_lettered"] == 2


@pytest.mark.django_db(transaction=True)
def test_raising_fails_every_message(batch: Any) -> None:
    attempts: list[list[int]] = []

    def load(messages: list[Message]) -> None:
        attempts.append([m.attempt for m in messages])
        if messages[0].attempt == 1:
            raise RuntimeError("warehouse down")

    batch("b.raise", "g", load, max_batch=10, max_attempts=3)
    publish("b.raise", 4)
    drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0), threads=1)
    assert attempts[0] == [1, 1, 1, 1]
    assert sorted(a for call in attempts[1:] for a in call) == [2, 2, 2, 2]
    assert all(s.acked and s.retry_count == 1 for s in states("g").values())


@pytest.mark.django_db(transaction=True)
def test_a_key_not_in_the_batch_fails_the_whole_batch(batch: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def load(messages: list[Message]) -> dict[object, BaseException]:
        return {"not a message": ValueError("x")}

    batch("b.key", "g", load, max_batch=10, max_attempts=1)
    publish("b.key", 3)
    drain(["g"])
    dead = dead_letters("b.key")
    assert len(dead) == 3
    assert all("not a message of its batch" in (d.last_error or "") for d in dead)
    assert "not a message of its batch" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_ordered_stops_at_a_failure_and_the_rest_wait_uncharged(batch: Any) -> None:
    calls: list[list[tuple[int, int]]] = []

    def load(messages: list[Message]) -> dict[Message, BaseException]:
        calls.append([(m.payload["n"], m.attempt) for m in messages])
        return {m: Retry(delay=0) for m in messages
                if m.payload["n"] == 2 and m.attempt == 1}

    batch("b.ord", "g", load, max_batch=10, ordered=True)
    publish("b.ord", 6)
    drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0))
    assert calls[0] == [(n, 1) for n in range(6)]
    # 0 and 1 acked; 2 retried (attempt 2); 3..5 given back, delivered after it, in
    # order, still on their first attempt.
    assert calls[1] == [(2, 2), (3, 1), (4, 1), (5, 1)]
    assert len(calls) == 2


@pytest.mark.django_db(transaction=True)
def test_ordered_batches_hold_one_partition_in_offset_order(batch: Any) -> None:
    calls: list[list[tuple[str, int]]] = []

    def load(messages: list[Message]) -> None:
        calls.append([(m.partition_key, m.offset) for m in messages])

    batch("b.ord2", "g", load, max_batch=4, ordered=True)
    publish("b.ord2", 20, partitions=2)
    drain(["g"])
    for call in calls:
        assert len({key for key, _ in call}) == 1
        assert [offset for _, offset in call] == sorted(offset for _, offset in call)
        assert len(call) <= 4
    assert sum(len(call) for call in calls) == 20


@pytest.mark.django_db(transaction=True)
def test_atomic_commits_the_writes_and_the_acks_together(batch: Any) -> None:
    from tests.testapp.models import Order

    def load(messages: list[Message]) -> None:
        Order.objects.bulk_create([Order(reference=str(m.payload["n"])) for m in messages])

    batch("b.atom", "g", load, max_batch=10, atomic=True)
    publish("b.atom", 5)
    runner = drain(["g"])
    assert sorted(int(o.reference) for o in Order.objects.all()) == list(range(5))
    assert all(s.acked for s in states("g").values())
    assert runner.stats["acked"] == 5


@pytest.mark.django_db(transaction=True)
def test_atomic_raising_rolls_back_the_writes_and_the_acks(batch: Any) -> None:
    from tests.testapp.models import Order

    def load(messages: list[Message]) -> None:
        Order.objects.bulk_create([Order(reference=f"{m.payload['n']}@{m.attempt}")
                                   for m in messages])
        if messages[0].attempt == 1:
            raise RuntimeError("after the writes")

    batch("b.atomr", "g", load, max_batch=10, atomic=True)
    publish("b.atomr", 3)
    drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0))
    # The first call's rows were rolled back with its acks; the second's committed.
    assert sorted(o.reference for o in Order.objects.all()) == ["0@2", "1@2", "2@2"]
    assert all(s.acked and s.retry_count == 1 for s in states("g").values())


@pytest.mark.django_db
def test_a_batch_of_n_costs_a_constant_number_of_statements(batch: Any) -> None:
    """The statements of a run (``run_consumers``: passes and handler calls in a fixed
    order, so the count does not depend on timing) for 10 messages and for 400, one batch
    each: the same, not one more per message (marks, acks: one statement per batch)."""
    counts = []
    for size in (10, 400):
        batch(f"b.q{size}", f"g{size}", lambda messages: None, max_batch=500)
        publish(f"b.q{size}", size)
        with CaptureQueriesContext(connection) as queries:
            report = run_consumers(group=f"g{size}")
        assert report.acked == size
        counts.append(len(queries))
    assert counts[1] <= counts[0] + 2, counts


@pytest.mark.django_db(transaction=True)
def test_atomic_with_a_mapping_acks_the_rest_in_its_transaction(batch: Any) -> None:
    """The acks of the others commit with the handler's rows; the failed message is
    retried (recorded after the commit) and acked by its next call."""
    from tests.testapp.models import Order

    def load(messages: list[Message]) -> dict[Message, BaseException]:
        Order.objects.bulk_create([Order(reference=f"{m.payload['n']}@{m.attempt}")
                                   for m in messages])
        return {m: Retry(delay=0) for m in messages
                if m.payload["n"] == 1 and m.attempt == 1}

    batch("b.atomm", "g", load, max_batch=10, atomic=True)
    publish("b.atomm", 3)
    runner = drain(["g"], conf=fast_settings(MIN_BACKOFF=0, MAX_BACKOFF=0))
    assert sorted(o.reference for o in Order.objects.all()) == ["0@1", "1@1", "1@2", "2@1"]
    assert runner.stats["acked"] == 3 and runner.stats["retry"] == 1
    assert all(s.acked for s in states("g").values())


def settled(topic: str) -> None:
    """Published an hour ago, as a backlog is: settled under every write horizon
    (MariaDB's trails the clock by a second or two, docs/guides/consuming.md)."""
    QueueMessage.objects.filter(topic=topic).update(created_at=F("created_at") - 3_600_000)


@pytest.mark.django_db(transaction=True)  # no open transaction holds the horizon back
def test_a_batch_acked_whole_moves_the_watermark_and_writes_no_ack_rows(batch: Any) -> None:
    """The acks of batches acked whole are covered by the watermark moved in the pass
    that records them: no ``write_outcomes`` statement (one row a message), and nothing
    left of their delivery state. A failure in the mapping is still written (retried)."""
    batch("b.cover", "g", lambda messages: None, max_batch=50)
    publish("b.cover", 120, partitions=2)
    settled("b.cover")
    with CaptureQueriesContext(connection) as queries:
        report = run_consumers(group="g")
    assert report.acked == 120
    outcome_writes = [q["sql"] for q in queries if "acked_at" in q["sql"]]
    assert outcome_writes == []
    assert states("g") == {}
    last = {key: max(m.offset for m in QueueMessage.objects.filter(
        topic="b.cover", partition_key=key)) for key in ("p0", "p1")}
    watermarks = dict(PartitionOffset.objects.filter(consumer_group="g", topic="b.cover")
                      .values_list("partition_key", "offset_acked"))
    assert all(watermarks[key] >= offset for key, offset in last.items()), watermarks

    failed: set[int] = set()

    def one_fails(messages: list[Message]) -> dict[Message, BaseException]:
        first = [m for m in messages if m.payload["n"] == 3 and 3 not in failed]
        failed.update(m.payload["n"] for m in first)
        return {m: Retry(delay=0) for m in first}

    batch("b.cover2", "g2", one_fails, max_batch=50)
    publish("b.cover2", 10)
    settled("b.cover2")
    with CaptureQueriesContext(connection) as queries:
        report = run_consumers(group="g2")
    assert report.acked == 10 and failed == {3}
    assert any("acked_at" in q["sql"] for q in queries)  # the retry: written
    assert states("g2") == {}
