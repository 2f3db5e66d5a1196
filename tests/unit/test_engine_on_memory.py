"""The engine (``Runner``, its subscribers, leases, watermarks) on the in-memory database
(tests/engine): no database, no wall-clock wait; the runners are stepped by hand and time
moves only when a test moves the manual clock."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from sqlqueue import Message, send_message
from sqlqueue.consuming.registry import Consumer, consumer, select_consumers, unregister
from sqlqueue.exceptions import SqlqueueError
from tests.engine.harness import ALIASES, MemoryQueue, SteppedRunner, memory_queue
from tests.engine.memory.tables import StoredMessage

TOPIC = "engine.t"
Seen = list[tuple[str, str, int, int]]  # (partition, id, attempt, clock ms at its start)


@pytest.fixture
def queue() -> Iterator[MemoryQueue]:
    with memory_queue() as q:
        yield q


@pytest.fixture
def registered() -> Iterator[Callable[..., Consumer]]:
    made: list[str] = []

    def register(group: str, handle: Callable[[Message], Any], **options: Any) -> Consumer:
        options = {"max_attempts": 3, "min_backoff": 0.5, "max_backoff": 2.0,
                   "visibility_timeout": 1.0, **options}
        made.append(group)
        return consumer(TOPIC, group=group, **options)(handle)  # type: ignore[no-any-return]

    yield register
    for group in made:
        unregister(group, TOPIC)


def publish(ids_by_partition: dict[str, list[str]], alias: str = ALIASES[0]) -> None:
    for partition, ids in ids_by_partition.items():
        for message_id in ids:
            send_message(TOPIC, message_id, partition_key=partition, id=message_id,
                         using=alias)


def steps(queue: MemoryQueue, runners: list[SteppedRunner], count: int,
          every_ms: int = 50) -> None:
    for _ in range(count):
        for runner in runners:
            runner.step()
        queue.clock.advance(every_ms)


def recorder(queue: MemoryQueue, seen: Seen, *, failing: Callable[[Message], bool] = (
        lambda m: False)) -> Callable[[Message], None]:
    def handle(message: Message) -> None:
        seen.append((message.partition_key, message.id, message.attempt, queue.clock.ms))
        if failing(message):
            raise RuntimeError(f"{message.id} fails attempt {message.attempt}")
    return handle


def test_messages_are_delivered_in_offset_order_per_partition(queue, registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({"p0": ["a1", "a2", "a3"], "p1": ["b1", "b2"]})
    runner = queue.runner(_consumers("g"))
    steps(queue, [runner], 10)
    assert [i for p, i, *_ in seen if p == "p0"] == ["a1", "a2", "a3"]
    assert [i for p, i, *_ in seen if p == "p1"] == ["b1", "b2"]
    assert all(attempt == 1 for *_, attempt, _ in seen)


def test_a_failure_is_retried_after_its_backoff_not_before(queue, registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen, failing=lambda m: m.attempt == 1))
    publish({"p0": ["m"]})
    runner = queue.runner(_consumers("g"))
    steps(queue, [runner], 3, every_ms=10)  # the failure is recorded
    failed_at = seen[0][3]
    steps(queue, [runner], 40, every_ms=10)  # 400 ms: less than min_backoff (500 ms)
    assert [(i, a) for _, i, a, _ in seen] == [("m", 1)]
    steps(queue, [runner], 40, every_ms=10)  # past 500 ms and its jitter (up to 33%)
    assert [(i, a) for _, i, a, _ in seen] == [("m", 1), ("m", 2)]
    assert 500 <= seen[1][3] - failed_at <= 700
    assert queue.tables.states == {}  # acked, under the watermark: its state is gone


def test_a_message_is_dead_lettered_after_max_attempts(queue, registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen, failing=lambda m: m.id == "doomed"))
    publish({"p0": ["doomed", "fine"]})
    runner = queue.runner(_consumers("g"))
    steps(queue, [runner], 60, every_ms=100)
    assert [a for _, i, a, _ in seen if i == "doomed"] == [1, 2, 3]
    letters = [m for m in queue.tables.messages.values() if m.topic == TOPIC + "_dlq"]
    assert [(m.id, m.failure_count, m.consumer_group) for m in letters] == [
        ("doomed@g", 3, "g")]
    assert "doomed fails attempt 3" in letters[0].last_error
    assert [a for _, i, a, _ in seen if i == "fine"] == [1]


def test_the_watermark_moves_over_acked_rows_and_their_state_goes(queue, registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({"p0": ["a1", "a2"], "p1": ["b1"]})
    runner = queue.runner(_consumers("g"))
    steps(queue, [runner], 30)
    last = max(queue.tables.messages)
    watermarks = {k[2]: row.offset_acked for k, row in queue.tables.watermarks.items()}
    assert watermarks == {"p0": last, "p1": last}
    assert queue.tables.states == {}
    assert queue.database.statements["delete_states_upto"] >= 2  # after the advances
    runner.stop_gracefully()
    assert queue.tables.leases == {}  # handed over at the stop


def test_two_runners_share_the_partitions(queue, registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({f"p{n}": [f"m{n}"] for n in range(4)})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    steps(queue, [first, second], 80)
    holders = [lease.leased_by for key, lease in queue.tables.leases.items() if key[0] == "g"]
    assert sorted(holders) == ["first", "first", "second", "second"]
    assert sorted(i for _, i, *_ in seen) == ["m0", "m1", "m2", "m3"]  # each once


def test_an_idle_runner_takes_a_stopped_member_s_partitions_once_they_have_news(
        queue, registered) -> None:
    """A member stops gracefully while the other is idle: the one left takes its
    partitions when a message is published to one of them, within about a second (an
    idle look at the membership once the log grew), not at its next renewal (10 s)."""
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({f"p{n}": [f"m{n}"] for n in range(4)})
    # Slow renewals; the messages kept (no garbage collection), so that every partition
    # stays discovered and is shared out at the first renewal.
    slow_renewals = {"LEASE_RENEW_INTERVAL": 10.0, "LEASE_DURATION": 30.0, "RETENTION": 3600}
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first", **slow_renewals)
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second",
                          **slow_renewals)
    steps(queue, [first, second], 120, every_ms=100)  # past a renewal: shared out
    assert len(seen) == 4
    gone = sorted(key[2] for key, lease in queue.tables.leases.items()
                  if lease.leased_by == "second")
    assert len(gone) == 2
    second.stop_gracefully()
    steps(queue, [first], 20, every_ms=100)  # idle, nothing new: no look, no takeover
    assert sorted(key[2] for key in queue.tables.leases) != sorted(f"p{n}" for n in range(4))
    publish({gone[0]: ["late"]})
    published_at = queue.clock.ms
    steps(queue, [first], 20, every_ms=100)
    started = [at for _, message_id, _, at in seen if message_id == "late"]
    assert started and started[0] - published_at <= 1_500, (started, published_at)
    assert all(lease.leased_by == "first" for lease in queue.tables.leases.values())


def test_a_vanished_runner_s_partitions_are_taken_over_after_its_lease(queue,
                                                                        registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({"p0": ["m1"]})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    first.run_once()  # marked delivered, handed out, never started: then it dies
    first.kill()
    assert seen == []
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    steps(queue, [second], 30, every_ms=100)  # 3 s: the first's lease (4 s) still holds
    assert seen == []
    steps(queue, [second], 30, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("m1", 2)]  # the lost delivery was charged
    assert queue.tables.leases[("g", TOPIC, "p0")].leased_by == "second"
    assert queue.tables.leases[("g", TOPIC, "p0")].generation == 2


def test_a_runner_that_stalls_past_its_lease_still_records_what_its_handler_finished(
        queue, registered) -> None:
    """SPEC section 10 (I5): a delivery whose handler finished is never delivered again
    because the runner's own thread was slow to record it. Here the runner's loop stalls
    longer than the lease (4 s) and the visibility timeout (1 s); nobody took the
    partition meanwhile, so the lease is still its own, at its generation, and the ack
    is written (found by the stepped history test, seed 467118399)."""
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({"p0": ["m1"]})
    runner = queue.runner(_consumers("g"))
    runner.run_once()  # m1 marked delivered
    assert runner.pool.run_handed_out() == 1  # its handler finished at once
    queue.clock.advance(5_000)  # the runner's own thread stalls
    steps(queue, [runner], 40, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("m1", 1)]
    assert queue.tables.leases[("g", TOPIC, "p0")].generation == 1


def test_a_stalled_runner_s_outcome_is_dropped_once_another_took_its_partition(
        queue, registered) -> None:
    """The converse: another runner took the lapsed lease (a new generation) and may
    have delivered the message again, so the stalled runner's late word is not written
    as the owner's; the message is delivered again after its visibility timeout."""
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({"p0": ["m1"]})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    first.run_once()
    first.pool.run_handed_out()
    queue.clock.advance(5_000)  # first stalls; second starts and takes the lapsed lease
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    second.run_once()
    assert queue.tables.leases[("g", TOPIC, "p0")].leased_by == "second"
    steps(queue, [first, second], 40, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("m1", 1), ("m1", 2)]
    assert first.subscribers[0].stats["abandoned"] == 1  # its late ack, not written


def test_a_lease_lost_and_found_again_at_its_old_generation_is_a_new_tenure(
        queue, registered) -> None:
    """A release deletes the lease row, and the next acquisition starts again at
    generation 1: a stalled runner that finds its partition again at the generation it
    had must still not record what it delivered before as the owner (the other runner
    delivered the same message meanwhile), and rebuilds its view of the partition."""
    seen: Seen = []
    registered("g", recorder(queue, seen, failing=lambda m: m.attempt == 1))
    publish({"p0": ["m1"]})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    first.run_once()
    first.pool.run_handed_out()  # attempt 1 fails; first stalls before recording it
    before = first.subscribers[0].partitions["p0"]
    queue.clock.advance(5_000)
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    steps(queue, [second], 3)  # takes the lapsed lease (generation 2), runs attempt 2
    second.stop_gracefully()  # acked, and the lease released: its row deleted
    assert ("g", TOPIC, "p0") not in queue.tables.leases
    first.run_once()  # finds the lease free: acquired again, at generation 1
    assert queue.tables.leases[("g", TOPIC, "p0")].generation == 1
    assert first.subscribers[0].stats["abandoned"] == 1  # its failure is not recorded
    assert first.subscribers[0].partitions["p0"] is not before
    steps(queue, [first], 40, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("m1", 1), ("m1", 2)]  # no retry of it


def test_a_delivery_is_not_made_again_before_its_visibility_timeout(queue,
                                                                    registered) -> None:
    seen: Seen = []
    registered("g", recorder(queue, seen), visibility_timeout=10.0)
    publish({"p0": ["m1"]})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    first.run_once()
    marked_at = queue.clock.ms
    first.kill()
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    steps(queue, [second], 90, every_ms=100)  # 9 s: leased long since, still invisible
    assert queue.tables.leases[("g", TOPIC, "p0")].leased_by == "second"
    assert seen == []
    steps(queue, [second], 20, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("m1", 2)]
    assert seen[0][3] >= marked_at + 10_000


def test_an_ordered_partition_never_has_two_messages_out_at_once(queue, registered) -> None:
    seen: Seen = []
    out: list[int] = []
    runner_box: list[SteppedRunner] = []

    def handle(message: Message) -> None:
        out.append(runner_box[0].pool.in_flight)
        recorder(queue, seen, failing=lambda m: m.id == "a1" and m.attempt == 1)(message)

    registered("g", handle, ordered=True, batch_size=10)
    publish({"p0": ["a1", "a2", "a3"]})
    runner_box.append(queue.runner(_consumers("g")))
    steps(queue, runner_box, 60, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("a1", 1), ("a1", 2), ("a2", 1), ("a3", 1)]
    assert set(out) == {1}  # each handler ran with itself the only one out


def test_a_takeover_starts_no_late_message_beside_a_run_under_the_earlier_lease(
        queue, registered) -> None:
    """Issue 51 (I5, ordered): the holder delivers ``long`` and freezes past its lease
    while its handler runs; a lower offset commits late meanwhile. The new holder starts
    nothing, the late message included, until ``long``'s visibility timeout has passed
    (it started the late one at once, beside the frozen holder's run)."""
    seen: Seen = []
    registered("g", recorder(queue, seen), ordered=True, visibility_timeout=10.0)
    late_offset = queue.database.allocate_offset()  # its transaction is still open
    publish({"p0": ["long"]})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    first.run_once()  # long marked delivered and handed out: its handler runs on, frozen
    marked_at = queue.clock.ms
    queue.clock.advance(1_000)
    _commit_late(queue, late_offset, "p0", "late")
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    steps(queue, [second], 85, every_ms=100)  # past the first's lease (4 s), inside VT
    assert queue.tables.leases[("g", TOPIC, "p0")].leased_by == "second"
    assert seen == []  # neither the late message nor long again
    steps(queue, [second], 30, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen] == [("late", 1), ("long", 2)]
    assert seen[0][3] >= marked_at + 10_000


def test_a_handler_whose_lease_ran_out_cannot_extend_its_visibility(queue,
                                                                    registered) -> None:
    """Issue 51 (I5): a new holder waits for the timeout it read when it took the lease;
    a holder that lost the lease (frozen, cut off) must not push that timeout back, or
    the new holder would start beside a run inside its (extended) timeout."""
    refused: list[str] = []

    def handle(message: Message) -> None:
        if message.attempt == 1:
            message.extend_visibility(2.0)  # within its lease: extended
            queue.clock.advance(5_000)  # frozen past the lease (4 s)
            try:
                message.extend_visibility(60.0)
            except SqlqueueError as exc:
                refused.append(str(exc))
                raise

    registered("g", handle, visibility_timeout=3.0)
    publish({"p0": ["m1"]})
    runner = queue.runner(_consumers("g"))
    runner.step()
    assert len(refused) == 1 and "no longer holds the partition's lease" in refused[0]
    state = queue.tables.states[("g", TOPIC, "p0", next(iter(queue.tables.messages)))]
    assert state.invisible_until < queue.clock.ms  # the refused 60 s were not written


def _commit_late(queue: MemoryQueue, offset: int, partition: str, message_id: str) -> None:
    """The row of ``offset``, allocated earlier, becomes visible now (a late commit)."""
    tables, now = queue.tables, queue.clock.ms
    tables.messages[offset] = StoredMessage(offset, TOPIC, partition, message_id,
                                            b'"late"', None, now, now, 0, 0)
    tables.message_ids[(TOPIC, partition, message_id)] = offset
    tables.messages = dict(sorted(tables.messages.items()))


def test_what_a_cycle_logs_is_written_after_its_transaction(queue, registered) -> None:
    """Issue 51: a log write that blocks (standard error piped to a reader that stopped)
    inside a cycle transaction kept the lease rows its fence locks for as long as it
    blocked. The lines a pass logs (here: its sweep finds a late-committed message) are
    written once its transaction has ended."""
    seen: Seen = []
    registered("g", recorder(queue, seen))
    late_offset = queue.database.allocate_offset()
    publish({"p0": ["m1"]})
    runner = queue.runner(_consumers("g"))
    runner.run_once()  # m1 handed out, still running: the watermark stays below late
    written: list[tuple[str, bool]] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append((record.getMessage(), connections[ALIASES[0]].in_atomic_block))

    watch = Watch()
    logger = logging.getLogger("sqlqueue.consumer")
    level = logger.level
    logger.addHandler(watch)
    logger.setLevel(logging.INFO)
    try:
        _commit_late(queue, late_offset, "p0", "late")
        for _ in range(30):  # a sweep finds it
            runner.run_once()
            queue.clock.advance(100)
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)
    found = [inside for message, inside in written if "late-committed" in message]
    assert found == [False]


def _consumers(group: str) -> list[Consumer]:
    return select_consumers([group], [TOPIC])
