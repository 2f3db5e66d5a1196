"""Batch consumers without a database: the decorator's validation, how deliveries are cut
into batches and held to fill (``max_wait``, on a manual clock), what a handler's result
means per message, and an ordered partition's run of consecutive messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import sqlqueue
from sqlqueue import ConfigurationError, Reject, Retry
from sqlqueue.consuming.batches import BadBatchResult, Filling, failed, outcomes_of, split
from sqlqueue.consuming.handlers import Delivery, build_message
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import Consumer, registered_consumers, unregister
from sqlqueue.storage.sql.base import FetchedRow
from tests.manual_clock import ManualSeconds

pytestmark = pytest.mark.unit


def noop(messages: list[sqlqueue.Message]) -> None:
    pass


@pytest.fixture
def forget() -> Iterator[None]:
    yield
    unregister("g", "unit.batch")


def row(offset: int, **fields: Any) -> FetchedRow:
    values: dict[str, Any] = {
        "offset": offset, "id": f"m{offset}", "payload": b"{}", "metadata": "",
        "priority": 0, "created_at": 0, "published_at": 0, "deliver_after": 0,
        "consumer_group": "", "acked": False, "retry_count": None, "invisible_until": 0,
        "failure_detail": None}
    values.update(fields)
    return FetchedRow(**{k: v for k, v in values.items()
                         if k in FetchedRow.__dataclass_fields__})


def deliveries(consumer: Consumer, offsets: list[tuple[str, int]]) -> list[Delivery]:
    return [Delivery(consumer, "default", key, row(offset), 1, sequence)
            for sequence, (key, offset) in enumerate(offsets)]


def test_batch_consumer_registers_with_its_batch_options(forget: None) -> None:
    sqlqueue.batch_consumer("unit.batch", group="g", max_batch=7, max_wait=0.5)(noop)
    [registered] = [c for c in registered_consumers() if c.topic == "unit.batch"]
    assert (registered.max_batch, registered.max_wait) == (7, 0.5)


@pytest.mark.parametrize(("options", "says"), [
    ({"max_batch": 0}, "max_batch is a whole number of messages from 1 to 10,000; got 0"),
    ({"max_batch": 10_001}, "got 10001"),
    ({"max_batch": True}, "got True"),
    ({"max_batch": 2.5}, "got 2.5"),
    ({"max_wait": -1}, "max_wait is a number of seconds from 0 to 60; got -1"),
    ({"max_wait": float("nan")}, "got nan"),
    ({"max_wait": "1"}, "got '1'"),
    ({"rate_limit": 0}, "rate_limit is a positive number"),
])
def test_bad_batch_options_are_refused_naming_the_problem(options: dict[str, Any],
                                                          says: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        sqlqueue.batch_consumer("unit.batch", group="g", **options)
    assert "@batch_consumer('unit.batch', group='g')" in str(refused.value)
    assert says in str(refused.value)


def test_the_read_ahead_holds_two_batches_unless_given() -> None:
    from sqlqueue.conf import QueueSettings

    conf = QueueSettings()
    assert Consumer("t", "g", noop, max_batch=300).options(conf).batch_size == 600
    assert Consumer("t", "g", noop, max_batch=300,
                    overrides=(("batch_size", 50),)).options(conf).batch_size == 50


def test_split_cuts_at_max_batch_and_an_ordered_batch_holds_one_partition() -> None:
    unordered = Consumer("t", "g", noop, max_batch=2)
    cut = split(unordered, deliveries(unordered, [("a", 1), ("b", 2), ("a", 3)]))
    assert [[d.row.offset for d in b.deliveries] for b in cut] == [[1, 2], [3]]
    ordered = Consumer("t", "g", noop, ordered=True, max_batch=2)
    cut = split(ordered, deliveries(ordered, [("a", 5), ("b", 2), ("a", 1), ("a", 7)]))
    assert sorted([(d.partition_key, d.row.offset) for d in b.deliveries] for b in cut) == [
        [("a", 1), ("a", 5)], [("a", 7)], [("b", 2)]]


def test_filling_holds_until_full_or_max_wait() -> None:
    clock = ManualSeconds(100.0)
    filling = Filling(clock)
    waits = Consumer("t", "g", noop, max_batch=4, max_wait=0.5)
    made = deliveries(waits, [("a", n) for n in range(1, 8)])
    assert filling.add(waits, made[:3]) == []  # 3 of 4: held
    assert filling.next_in() == 0.5
    clock.sleep(0.2)
    full = filling.add(waits, made[3:6])  # 6 held: one full batch goes, 2 stay
    assert [len(b.deliveries) for b in full] == [4]
    assert filling.due() == []
    assert filling.next_in() == pytest.approx(0.3)  # counted from the first held
    clock.sleep(0.3)
    assert [[d.row.offset for d in b.deliveries] for b in filling.due()] == [[5, 6]]
    assert filling.next_in() is None
    no_wait = Consumer("t", "g2", noop, max_batch=4)
    assert [len(b.deliveries) for b in filling.add(no_wait, made[:1])] == [1]
    filling.add(waits, made[6:])
    assert filling.release() == made[6:] and not filling.held


def outcome_kinds(consumer: Consumer, result: Any, count: int = 4) -> list[str]:
    made = deliveries(consumer, [("a", n) for n in range(1, count + 1)])
    messages = [build_message(d, extend=False) for d in made]
    return [o.kind for o in outcomes_of(made, messages, result(messages), "ack")]


def test_none_acks_all_and_a_mapping_fails_those_it_names() -> None:
    consumer = Consumer("t", "g", noop, max_batch=10)
    assert outcome_kinds(consumer, lambda ms: None) == ["ack"] * 4
    assert outcome_kinds(consumer, lambda ms: {ms[1]: Reject("x"), ms[2]: Retry(delay=1),
                                               ms[3]: ValueError("y")}) == [
        "ack", "reject", "retry", "fail"]


def test_ordered_stops_at_the_first_failure() -> None:
    consumer = Consumer("t", "g", noop, ordered=True, max_batch=10)
    assert outcome_kinds(consumer, lambda ms: {ms[1]: ValueError(), ms[3]: Reject()}) == [
        "ack", "fail", "not_started", "not_started"]
    made = deliveries(consumer, [("a", 1), ("a", 2)])
    assert [o.kind for o in failed(made, RuntimeError())] == ["fail", "not_started"]
    unordered = Consumer("t", "g", noop, max_batch=10)
    assert [o.kind for o in failed(made, Reject())] == ["reject", "not_started"]
    made = deliveries(unordered, [("a", 1), ("a", 2)])
    assert [o.kind for o in failed(made, Reject())] == ["reject", "reject"]


@pytest.mark.parametrize(("result", "says"), [
    (lambda ms: {"elsewhere": ValueError()}, "not a message of its batch"),
    (lambda ms: {ms[0]: "not an exception"}, "the mapping's values are exceptions"),
    (lambda ms: [ms[0]], "returned list"),
])
def test_a_result_that_is_not_a_mapping_of_its_messages_is_an_error(result: Any,
                                                                    says: str) -> None:
    with pytest.raises(BadBatchResult, match=says):
        outcome_kinds(Consumer("t", "g", noop, max_batch=10), result)


def test_an_ordered_run_is_consecutive_due_messages_of_the_partition() -> None:
    state = PartitionState("a", watermark=0)
    state.absorb([row(n) for n in (1, 2, 3, 5, 8)], "g")
    state.entries[5].due_ms = 10_000  # a retry backing off: the run stops before it
    assert [e.offset for e in state.ready(1000, 100, True, run=10)] == [1, 2, 3]
    assert [e.offset for e in state.ready(1000, 100, True, run=2)] == [1, 2]
    assert [e.offset for e in state.ready(1000, 100, True)] == [1]  # a single consumer
    state.dispatched(state.entries[1], 5000)
    assert state.ready(1000, 100, True, run=10) == []  # a run in flight holds it
