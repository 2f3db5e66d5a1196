"""The consumer engine against a real database: delivery, retries, dead letters,
ordering, atomic handlers, scheduling, priorities, watermarks and cost."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import sqlqueue
from sqlqueue import Message, OutgoingMessage, send_message, send_messages
from sqlqueue.consuming.backoff import JITTER
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import (
    RUN_TIMEOUT,
    drain,
    drain_until_watermarks,
    fast_settings,
    reached,
    register,
    run_until,
    watermarks,
)
from tests.manual_clock import ManualClock
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture


class Journal:
    """Thread-safe record of handler calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int, int, Any]] = []  # (partition, offset, attempt, payload)
        self.times: dict[int, list[float]] = defaultdict(list)

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls.append((message.partition_key, message.offset, message.attempt,
                               message.payload))
            self.times[message.offset].append(time.monotonic())

    def offsets(self) -> list[int]:
        return sorted(c[1] for c in self.calls)


def db_now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def test_every_message_is_handled_once_and_the_watermark_follows(register: Any) -> None:
    journal = register("t", "g", Journal())
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 3}") for n in range(30)])
    runner = drain(["g"])
    assert journal.offsets() == sorted(s.offset for s in sent)
    assert all(attempt == 1 for _, _, attempt, _ in journal.calls)
    assert runner.subscribers[0].stats["acked"] == 30
    drain_until_watermarks("g", {
        f"k{n}": max(s.offset for s in sent if s.partition_key == f"k{n}") for n in range(3)
    })
    assert not DeliveryState.objects.exists()  # cleaned behind the watermarks
    assert len(journal.calls) == 30  # draining again delivered nothing twice


def test_message_fields(register: Any) -> None:
    seen: list[Message] = []
    register("orders", "g", seen.append)
    sent = send_message("orders", {"order_id": 7}, partition_key="c-1", id="o-7",
                        metadata={"trace": "abc"})
    drain(["g"])
    (message,) = seen
    assert (message.topic, message.partition_key, message.offset, message.id) == (
        "orders", "c-1", sent.offset, "o-7")
    assert message.payload == {"order_id": 7}
    assert message.metadata == {"trace": "abc"}
    assert (message.attempt, message.consumer_group) == (1, "g")
    assert message.created_at.tzinfo is not None and message.published_at.tzinfo is not None


def test_retry_then_success(register: Any) -> None:
    attempts: list[int] = []

    def flaky(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt < 3:
            raise ConnectionError("the payment provider is down")

    register("t", "g", flaky)
    send_message("t", 1)
    runner = drain(["g"])
    assert attempts == [1, 2, 3]
    assert runner.subscribers[0].stats["retried"] == 2
    assert not QueueMessage.objects.filter(topic="t_dlq").exists()


def test_backoff_spaces_retries(
        register: Any, clocked: Callable[[str], tuple[Runner, ManualClock]]) -> None:
    """min(max_backoff, min_backoff * 2^(n-1)), plus up to 33% jitter: never early, capped
    by max_backoff. On a clock the test moves, so a slow machine changes nothing."""
    attempts: list[int] = []

    def failing(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt < 5:
            raise RuntimeError("not yet")

    register("t", "g", failing)  # fast_settings(): MIN_BACKOFF 0.02 s, MAX_BACKOFF 0.1 s
    send_message("t", 1)
    runner, clock = clocked("g")
    stats = runner.subscribers[0].stats
    for failed, base_ms in enumerate([20, 40, 80, 100], start=1):  # the last one capped
        run_until(runner, lambda n=failed: stats["retried"] == n)  # its retry is scheduled
        clock.advance(base_ms - 1)
        for _ in range(3):
            runner.run_once()
        assert attempts == list(range(1, failed + 1)), f"attempt {failed + 1} came early"
        clock.advance(math.ceil(base_ms * JITTER) + 2)  # past the largest jitter
        run_until(runner, lambda n=failed: len(attempts) == n + 1)
    run_until(runner, lambda: stats["acked"] == 1)
    assert attempts == [1, 2, 3, 4, 5]


def test_retry_with_an_explicit_delay(register: Any) -> None:
    journal = Journal()

    def later(message: Message) -> None:
        journal(message)
        if message.attempt == 1:
            raise sqlqueue.Retry(delay=0.3)

    register("t", "g", later)
    sent = send_message("t", 1)
    drain(["g"])
    first, second = journal.times[sent.offset]
    assert second - first >= 0.3


def test_dead_letter_after_max_attempts_and_never_again(register: Any) -> None:
    calls: list[int] = []

    def broken(message: Message) -> None:
        calls.append(message.attempt)
        raise ValueError("cannot parse the order")

    register("orders", "billing", broken, max_attempts=3)
    sent = send_message("orders", {"order_id": 1}, partition_key="c-1", id="o-1")
    drain(["billing"])
    assert calls == [1, 2, 3]
    dead = QueueMessage.objects.get(topic="orders_dlq")
    assert (dead.partition_key, dead.consumer_group, dead.original_topic) == (
        "c-1", "billing", "orders")
    assert dead.failure_count == 3
    assert "ValueError: cannot parse the order" in dead.last_error
    assert "Traceback" in dead.last_error
    assert dead.failure_detail == {"id": "o-1", "offset": sent.offset, "group": "billing",
                                   "reason": "max_attempts"}
    assert bytes(dead.payload) == bytes(QueueMessage.objects.get(offset=sent.offset).payload)
    drain(["billing"])
    assert calls == [1, 2, 3]  # never delivered to that group again


def test_reject_dead_letters_at_once(register: Any) -> None:
    calls: list[int] = []

    def picky(message: Message) -> None:
        calls.append(message.attempt)
        raise sqlqueue.Reject("unknown order type")

    register("orders", "g", picky)
    send_message("orders", 1)
    drain(["g"])
    assert calls == [1]
    dead = QueueMessage.objects.get(topic="orders_dlq")
    assert dead.last_error == "unknown order type"
    assert dead.failure_detail["reason"] == "rejected"


def test_groups_are_isolated(register: Any) -> None:
    good = register("orders", "shipping", Journal())

    def bad(message: Message) -> None:
        raise sqlqueue.Reject("billing cannot handle it")

    register("orders", "billing", bad)
    sent = send_messages("orders", list(range(5)))
    drain(["billing"])
    # Billing's dead letters removed nothing from the log: shipping still gets it all.
    assert QueueMessage.objects.filter(topic="orders").count() == 5
    assert QueueMessage.objects.filter(topic="orders_dlq", consumer_group="billing").count() == 5
    drain(["shipping"])
    assert good.offsets() == sorted(s.offset for s in sent)


def test_two_groups_dead_letter_the_same_message(register: Any) -> None:
    for group in ("a", "b"):
        register("t", group, lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")))
    send_message("t", 1, id="same")
    drain(["a", "b"])
    assert sorted(QueueMessage.objects.filter(topic="t_dlq")
                  .values_list("consumer_group", flat=True)) == ["a", "b"]


def test_ordered_partitions_never_overlap_and_follow_offsets(register: Any) -> None:
    lock = threading.Lock()
    running: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    order: dict[str, list[int]] = defaultdict(list)

    def careful(message: Message) -> None:
        with lock:
            running[message.partition_key] += 1
            if running[message.partition_key] > 1:
                overlaps.append(message.partition_key)
            order[message.partition_key].append(message.offset)
        time.sleep(0.005)
        with lock:
            running[message.partition_key] -= 1

    register("t", "g", careful, ordered=True)
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}") for n in range(30)])
    drain(["g"], threads=4)
    assert overlaps == []
    for key in ("k0", "k1"):
        expected = [s.offset for s in sent if s.partition_key == key]
        assert order[key] == expected


def test_ordered_partition_waits_for_a_failing_message(register: Any) -> None:
    order: list[tuple[int, int]] = []

    def first_fails_twice(message: Message) -> None:
        order.append((message.payload, message.attempt))
        if message.payload == 0 and message.attempt < 3:
            raise RuntimeError("transient")

    register("t", "g", first_fails_twice, ordered=True)
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    drain(["g"])
    assert order == [(0, 1), (0, 2), (0, 3), (1, 1), (2, 1)]


def test_unordered_retry_does_not_hold_back_later_messages(register: Any) -> None:
    order: list[int] = []

    def first_fails(message: Message) -> None:
        order.append(message.payload)
        if message.payload == 0 and message.attempt == 1:
            raise sqlqueue.Retry(delay=0.3)

    register("t", "g", first_fails)
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    drain(["g"])
    assert order[:3] == [0, 1, 2] and order[3] == 0


def test_atomic_handler_writes_commit_with_the_ack(register: Any) -> None:
    def create_order(message: Message) -> None:
        Order.objects.create(reference=f"R{message.payload}-{message.attempt}")
        if message.attempt == 1:
            raise RuntimeError("after the write: everything must roll back")

    register("t", "g", create_order, atomic=True)
    send_message("t", 1)
    drain(["g"])
    assert list(Order.objects.values_list("reference", flat=True)) == ["R1-2"]
    assert not DeliveryState.objects.filter(acked=False).exists()


def test_scheduled_message_is_not_delivered_early(register: Any) -> None:
    seen: list[int] = []

    def record_time(message: Message) -> None:
        seen.append(db_now_ms())

    register("t", "g", record_time)
    sent = send_message("t", 1, delay=0.5)
    due = QueueMessage.objects.get(offset=sent.offset).deliver_after
    drain(["g"])  # a message scheduled for later does not keep --until-empty running
    assert seen == [] or seen[0] >= due
    while db_now_ms() < due:  # wait on the condition: the database clock passed it
        time.sleep(0.05)
    drain(["g"])
    assert len(seen) == 1 and seen[0] >= due


def test_scheduled_message_does_not_hold_back_later_ones(register: Any) -> None:
    journal = register("t", "g", Journal())
    send_message("t", "later", partition_key="k", delay=3600)
    now = send_message("t", "now", partition_key="k")
    drain(["g"])
    assert [c[1] for c in journal.calls] == [now.offset]


def test_priority_orders_deliverable_messages(register: Any) -> None:
    journal = register("t", "g", Journal(), batch_size=10)
    send_messages("t", [OutgoingMessage(p, partition_key="k", priority=p)
                        for p in (50, 10, 90, 0, 50)])
    drain(["g"], threads=1)
    assert [c[3] for c in journal.calls] == [0, 10, 50, 50, 90]


def test_a_row_with_only_the_rfc_columns_is_consumed(register: Any) -> None:
    journal = register("t", "g", Journal())
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_messages (topic, id, payload, metadata, partition_key, "
            "created_at, published_at, failed_at, failure_count, last_error, original_topic, "
            "failure_detail) VALUES ('t', 'rfc-1', %s, NULL, 'k', 1, 1, 0, 0, '', '', NULL)",
            [b'{"from": "go"}'],
        )
    drain(["g"])
    assert [c[3] for c in journal.calls] == [{"from": "go"}]


def test_extend_visibility(register: Any) -> None:
    observed: list[int] = []

    def slow(message: Message) -> None:
        message.extend_visibility(600)
        observed.append(DeliveryState.objects.get(message_offset=message.offset).invisible_until)

    register("t", "g", slow)
    send_message("t", 1)
    before = db_now_ms()
    drain(["g"])
    assert observed and observed[0] >= before + 590_000


def test_max_messages_stops_after_that_many(register: Any) -> None:
    journal = register("t", "g", Journal())
    send_messages("t", list(range(10)))
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    runner = Runner(select_consumers(["g"]), max_messages=4, conf=fast_settings())
    runner.run(install_signal_handlers=False)
    assert len(journal.calls) == 4
    assert DeliveryState.objects.filter(acked=False).count() == 0  # nothing left charged


# -- cost --------------------------------------------------------------------------------------

def test_draining_costs_a_few_statements_per_batch_not_per_message(
    register: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost of draining grows with batches, not messages: one fetch, one multi-row
    mark and one multi-row outcome write per batch of 100, and a pass costs a handful of
    statements. How many passes run while handlers finish and the late-commit window
    closes depends on the machine's speed (a loaded CI machine runs more of them), so
    the count of passes is bounded per batch, not exactly. The steady figure (about
    0.08 statements per message) is measured by ``bench.statements``."""
    from sqlqueue.consuming.transactions import FencedTransactions

    passes = []
    original = FencedTransactions.deliver

    def counted(self: FencedTransactions, *args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FencedTransactions, "deliver", counted)
    register("t", "g", lambda message: None, batch_size=100)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(2000)])
    with CaptureQueriesContext(connection) as queries:
        runner = drain_in_this_thread(["g"])
    passes_while_counted = len(passes)
    assert runner.subscribers[0].stats["acked"] == 2000
    drain_until_watermarks("g", {"k": sent[-1].offset})
    passes = passes[:passes_while_counted]
    statements = [" ".join(q["sql"].split()) for q in queries.captured_queries]
    fetches = sum(1 for s in statements if "FROM " in s and "queue_messages" in s
                  and "queue_delivery_state" in s)
    state_writes = sum(1 for s in statements if s.startswith("INSERT INTO")
                       and "queue_delivery_state" in s)
    print(f"draining: {len(statements)} statements, {len(passes)} passes, {fetches} fetches, "
          f"{state_writes} delivery-state writes for 2000 messages")
    assert fetches <= 2000 // 100 + 1
    # A pass that finds only handler outcomes records them in one outcome write; a loaded machine
    # runs a few more such passes per batch, never one per message.
    assert len(passes) <= 4 * fetches, f"{len(passes)} passes for {fetches} batches"
    # A pass writes delivery state at most twice: one multi-row mark, one multi-row outcome write.
    assert state_writes <= 2 * len(passes)
    # Each pass: its transaction (2), the fence, the head, the write horizon. Plus, per run
    # or per second: lease ticks, membership checks, watermark moves; and at the exit, on
    # MySQL, up to 7 looks (about 6 statements each) at a write horizon that trails the
    # clock, until it passes the rows acked last (sqlqueue.consuming.exiting).
    assert len(statements) <= 5 * len(passes) + fetches + state_writes + 40 + 7 * 6, statements


def drain_in_this_thread(groups: list[str]) -> Any:
    """Like drain(), on the test's own thread so its connection's queries are counted."""
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    runner = Runner(select_consumers(groups), until_empty=True, conf=fast_settings())
    runner.run(install_signal_handlers=False)
    return runner


def test_an_idle_subscriber_polls_with_one_query(register: Any) -> None:
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    register("t", "g", lambda message: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(5)])
    # Lease upkeep (4 statements per renew interval) is not polling: keep it out of the count.
    conf = fast_settings(LEASE_DURATION=300, LEASE_RENEW_INTERVAL=100)
    runner = Runner(select_consumers(["g"]), conf=conf)
    runner.start_handler_threads()
    head = sent[-1].offset
    deadline = time.monotonic() + 20
    # Warm up until every watermark reached the head: drained and settled.
    while not reached("g", {f"k{n}": head for n in range(5)}):
        assert time.monotonic() < deadline, watermarks("g")
        runner.run_once()
        time.sleep(0.02)
    # The pauses are read once a second (sqlqueue.consuming.pauses), not each poll: an
    # hour here, so that a slow machine's three passes do not span two reads.
    runner.pauses.interval = 3600
    pause_reads = 0
    for _ in range(3):
        with CaptureQueriesContext(connection) as queries:
            runner.run_once()
        polls = [q["sql"] for q in queries if "queue_flow_control" not in q["sql"]]
        pause_reads += len(queries) - len(polls)
        assert len(polls) == 1, polls  # the log's head, nothing else
    assert pause_reads <= 1
    runner.stop()
    runner.shutdown()


def test_a_pass_moves_a_few_watermarks_and_the_next_passes_the_rest(register: Any) -> None:
    """Twelve partitions whose messages are done: their watermarks move over the next
    passes, at most ADVANCES_PER_PASS a pass (the pass's new deliveries wait for its
    commit), in one write a pass however many move (each partition cost a sweep, a write
    and a delete of its own)."""
    from sqlqueue.consuming.watermarks import ADVANCES_PER_PASS

    journal = register("t", "g", Journal())
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n:02d}")
                               for n in range(12)])
    conf = fast_settings(LEASE_DURATION=300, LEASE_RENEW_INTERVAL=100)
    runner = Runner(select_consumers(["g"]), conf=conf)
    runner.start_handler_threads()
    moved: list[int] = []  # watermarks moved by each pass
    writes: list[int] = []  # statements that wrote watermarks, each pass

    def one_pass() -> None:
        before = watermarks("g")
        with CaptureQueriesContext(connection) as queries:
            runner.run_once()
        after = watermarks("g")
        moved.append(sum(1 for key, value in after.items()
                         if key in before and value != before[key]))
        writes.append(sum('UPDATE "queue_offsets"' in q["sql"].replace("`", '"')
                          for q in queries))

    try:
        deadline = time.monotonic() + 30
        while not reached("g", {f"k{n:02d}": sent[n].offset for n in range(12)}):
            assert time.monotonic() < deadline, watermarks("g")
            one_pass()
            time.sleep(0.02)
    finally:
        runner.stop()
        runner.shutdown()
    assert len(journal.calls) == 12
    assert max(moved) <= ADVANCES_PER_PASS < 12, moved
    assert max(writes) <= 1, writes
    assert sum(moved) >= 12, moved  # every partition's watermark moved


class OpenPublish:
    """A thread that publishes "late" to one partition in a transaction it keeps open
    until ``commit()``: its offset is taken, its row not visible yet (a late commit)."""

    def __init__(self, topic: str, partition_key: str) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        self.offset = 0
        self.thread = threading.Thread(target=self._publish, args=(topic, partition_key))

    def _publish(self, topic: str, partition_key: str) -> None:
        from django.db import connections

        try:
            with transaction.atomic():
                self.offset = send_message(topic, "late", partition_key=partition_key).offset
                self.held.set()
                self.release.wait(30)
        finally:
            connections.close_all()

    def start(self) -> int:
        """Start it; the offset its message holds, once it holds one."""
        self.thread.start()
        assert self.held.wait(30)
        return self.offset

    def commit(self) -> None:
        self.release.set()
        if self.thread.is_alive():
            self.thread.join(30)


@pytest.fixture
def narrowing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls ask which partitions have new rows first (``narrows_fetches``: PostgreSQL's
    way, tried here on every database)."""
    monkeypatch.setattr(type(store_for(connection)), "narrows_fetches", True)


def test_a_poll_fetches_only_the_partitions_with_new_rows(register: Any,
                                                         narrowing: None) -> None:
    """Eight partitions read to their end; a publish into one: the next poll asks which
    partitions have new rows and fetches that one alone (on PostgreSQL a fetch of all
    eight took 3-5 ms to plan), and the others stay covered to the new head."""
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    journal = register("t", "g", Journal())
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(8)])
    conf = fast_settings(LEASE_DURATION=300, LEASE_RENEW_INTERVAL=100)
    runner = Runner(select_consumers(["g"]), conf=conf)
    runner.start_handler_threads()
    try:
        run_until(runner, lambda: len(journal.calls) == 8)
        run_until(runner, lambda: reached("g", {f"k{n}": sent[-1].offset for n in range(8)}))
        new = send_message("t", "new", partition_key="k5")
        with CaptureQueriesContext(connection) as queries:
            runner.run_once()
        fetches = [q["sql"] for q in queries if 'm."offset"' in q["sql"].replace("`", '"')
                   and "queue_delivery_state" in q["sql"]]
        assert len(fetches) == 1 and "UNION" not in fetches[0], fetches
        asked = [q["sql"] for q in queries if "DISTINCT" in q["sql"]]
        assert len(asked) == 1, [q["sql"][:80] for q in queries]
        run_until(runner, lambda: len(journal.calls) == 9)
        assert journal.calls[-1][3] == "new"
        (subscriber,) = runner.subscribers
        assert all(state.covered >= new.offset for state in subscriber.partitions.values())
    finally:
        runner.stop()
        runner.shutdown()


def test_a_late_commit_in_a_partition_a_poll_passed_over_is_delivered(
    register: Any, server_database: None, narrowing: None,
) -> None:
    """A publishing transaction holds an offset in k0 while k1 gets later messages: the
    polls see no row of k0 below the new head and pass it over (covered to the head).
    When the transaction commits, its message is still delivered (the sweep of k0's
    window), and the watermarks pass it."""
    journal = register("t", "g", Journal())
    first = send_messages("t", [OutgoingMessage("k0 first", partition_key="k0"),
                                OutgoingMessage("k1 first", partition_key="k1")])
    runner = Runner(select_consumers(["g"]), conf=fast_settings())
    runner.start_handler_threads()
    publisher = OpenPublish("t", "k0")
    try:
        run_until(runner, lambda: len(journal.calls) == 2)
        run_until(runner, lambda: reached("g", {"k0": first[0].offset,
                                                "k1": first[1].offset}))
        late = publisher.start()
        after = send_messages("t", [OutgoingMessage(n, partition_key="k1") for n in range(3)])
        with CaptureQueriesContext(connection) as queries:
            run_until(runner, lambda: len(journal.calls) == 5)
        assert any("DISTINCT" in q["sql"] for q in queries)  # k0 was passed over
        publisher.commit()
        run_until(runner, lambda: len(journal.calls) == 6)
        assert journal.calls[-1][3] == "late"
        run_until(runner, lambda: reached("g", {"k0": late, "k1": after[-1].offset}))
    finally:
        publisher.commit()
        runner.stop()
        runner.shutdown()


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_fetch_uses_the_partition_offset_index(register: Any) -> None:
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 5}") for n in range(200)])
    sql = store_for(connection).sql.fetch_messages("", "", "", 0, 0)[0]
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
            cursor.execute("EXPLAIN " + sql, ["g", 0, "t", "k1", 0, 100])
            plan = str(cursor.fetchall())
        elif connection.vendor == "postgresql":
            # A table of a few pages is read whole, rightly: give the planner a real one.
            send_messages("t", [OutgoingMessage(n, partition_key=f"other{n % 20}")
                                for n in range(3000)])
            cursor.execute("ANALYZE queue_messages")
            cursor.execute("EXPLAIN " + sql, ["g", 0, "t", "k1", 0, 100])
            plan = str(cursor.fetchall())
            assert "Seq Scan on queue_messages" not in plan, plan
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, ["g", 0, "t", "k1", 0, 100])
            plan = str(cursor.fetchall())
    assert "idx_topic_partition_offset" in plan


# -- late commits (I4) -------------------------------------------------------------------------

def test_a_late_committed_message_is_still_delivered(
    register: Any, server_database: None,
) -> None:
    """A publishing transaction takes an offset, stays open while later messages are
    published and consumed, then commits: its message must still be delivered."""
    journal = register("t", "g", Journal())
    publisher = OpenPublish("t", "k")
    late = publisher.start()
    after = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    drain(["g"])
    assert [c[3] for c in journal.calls] == [0, 1, 2]
    watermark = PartitionOffset.objects.get(consumer_group="g", partition_key="k").offset_acked
    assert watermark < late < after[0].offset  # the watermark waits below the open one
    publisher.commit()
    drain(["g"])
    assert sorted(c[3] for c in journal.calls if isinstance(c[3], str)) == ["late"]
    drain_until_watermarks("g", {"k": after[-1].offset})


@pytest.fixture
def clocked() -> Iterator[Callable[[str], tuple[Runner, ManualClock]]]:
    """A runner of one group on a clock the test moves (from the database's now), its
    handler threads started; stopped at the end."""
    made: list[Runner] = []

    def make(group: str) -> tuple[Runner, ManualClock]:
        clock = ManualClock(db_now_ms())
        runner = Runner(select_consumers([group]), conf=fast_settings(), clock=clock)
        runner.start_handler_threads()
        made.append(runner)
        return runner, clock

    yield make
    for runner in made:
        runner.stop()
        runner.shutdown()


def test_a_handler_past_its_visibility_timeout_is_delivered_again(
        register: Any, clocked: Callable[[str], tuple[Runner, ManualClock]]) -> None:
    attempts: list[int] = []
    release = threading.Event()

    def hangs_first(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt == 1:
            release.wait(RUN_TIMEOUT)

    register("t", "g", hangs_first, visibility_timeout=0.3)
    send_message("t", 1)
    runner, clock = clocked("g")
    delivered = runner.subscribers[0].stats
    try:
        run_until(runner, lambda: attempts == [1])
        clock.advance(299)  # not yet past the visibility timeout
        for _ in range(3):
            runner.run_once()
        assert delivered["delivered"] == 1
        clock.advance(2)  # past it, while the first attempt still runs
        run_until(runner, lambda: attempts == [1, 2])
        assert delivered["delivered"] == 2
    finally:
        release.set()
    run_until(runner, lambda: runner.pool.in_flight == 0)
    assert attempts == [1, 2]


def test_extend_visibility_prevents_a_second_delivery(
        register: Any, clocked: Callable[[str], tuple[Runner, ManualClock]]) -> None:
    attempts: list[int] = []
    extended, release = threading.Event(), threading.Event()

    def long_but_alive(message: Message) -> None:
        attempts.append(message.attempt)
        message.extend_visibility(5)
        extended.set()
        release.wait(RUN_TIMEOUT)

    register("t", "g", long_but_alive, visibility_timeout=0.3)
    send_message("t", 1)
    runner, clock = clocked("g")
    try:
        run_until(runner, extended.is_set)
        clock.advance(1_000)  # past the visibility timeout, within the extension
        for _ in range(3):
            runner.run_once()
        # Decided on this thread by each pass: a second delivery would be counted here
        # before a handler thread started it.
        assert runner.subscribers[0].stats["delivered"] == 1
    finally:
        release.set()
    run_until(runner, lambda: runner.pool.in_flight == 0)
    assert attempts == [1]


# -- lock waits behind a transaction pooler ------------------------------------------------

@pytest.mark.parametrize("pooled", [False, True])
def test_lock_waits_are_bounded_per_transaction_behind_a_pooler(
    register: Any, monkeypatch: pytest.MonkeyPatch, pooled: bool
) -> None:
    """Directly, the runner bounds its session's lock waits once. Behind a pooler (whose
    sessions other clients get next) its session keeps the server's default, and each of
    its transactions bounds its own lock waits (SET LOCAL)."""
    if connection.vendor != "postgresql":
        pytest.skip("lock_timeout is PostgreSQL's; MySQL's session variable and SQLite's "
                    "busy timeout belong to a connection no pooler shares")
    from sqlqueue.consuming.server import lock_wait_seconds
    from sqlqueue.consuming.subscriber import Subscriber

    store_class = type(store_for(connection))
    monkeypatch.setattr(store_class, "through_pooler", lambda self, cursor: pooled)
    in_transactions: list[str] = []
    fence = Subscriber.fence

    def fence_and_look(self: Subscriber, cursor: Any) -> Any:
        fenced = fence(self, cursor)
        cursor.execute("SHOW lock_timeout")
        in_transactions.append(cursor.fetchone()[0])
        return fenced

    in_session: list[str] = []  # between transactions
    check_pauses = Runner._check_pauses

    def look_and_check_pauses(self: Runner) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            in_session.append(cursor.fetchone()[0])
        check_pauses(self)

    monkeypatch.setattr(Subscriber, "fence", fence_and_look)
    monkeypatch.setattr(Runner, "_check_pauses", look_and_check_pauses)
    register("t", "g", Journal())
    send_messages("t", list(range(5)))
    conf = fast_settings()
    Runner(select_consumers(["g"]), until_empty=True, conf=conf).run(
        install_signal_handlers=False)
    bounded = f"{lock_wait_seconds(conf)}s"
    assert in_transactions and set(in_transactions) == {bounded}
    assert in_session and set(in_session) == {"0" if pooled else bounded}
