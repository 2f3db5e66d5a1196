"""A connection that reaches another server without any error (a proxy such as ProxySQL or
MaxScale moves idle connections to a new primary): the head query and every fence say
which server answered, and a change drops everything learnt on the old one (issue 15).

The move is simulated by changing what the server-identity expression answers; the same
database stands for the new server. tests/acceptance/test_failover.py moves a real
``runconsumer`` to a real second server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from sqlqueue import Message, events, send_message, storage
from sqlqueue.consuming.counter import OffsetCounterWatch
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner, ServerChanged
from sqlqueue.consuming.server import Head
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.operations.positions import reset_position
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import fast_settings, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture


@pytest.fixture
def runner_of_g() -> Iterator[Callable[[], Runner]]:
    """Makes the runner of group g (once its consumer is registered)."""
    made: list[Runner] = []

    def make() -> Runner:
        runner = Runner(select_consumers(["g"]), conf=fast_settings(VISIBILITY_TIMEOUT=1))
        runner.start_handler_threads()
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.stop()
        runner.shutdown()


def move_to_another_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(store_for(connection)), "server_identity_sql",
                        "'another server'")


def cycle_until(runner: Runner, condition: Any, timeout: float = 20, what: str = "") -> None:
    """Passes of ``runner`` until ``condition``; ``timeout`` only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        try:
            runner.run_once()
        except ServerChanged as exc:  # what Runner.run does with it
            runner._forget_server(exc.now)
        time.sleep(0.01)


def test_outcomes_of_deliveries_made_on_the_old_server_are_dropped(
        register: Any, runner_of_g: Callable[[], Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []
    release, release_again = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        attempts.append(message.attempt)
        # The old server's delivery is void on the new one: delivered again at once,
        # held here until the old one's outcome was dropped.
        (release if message.attempt == 1 else release_again).wait(30)
        connections.close_all()

    register("t", "g", handler)
    runner = runner_of_g()
    sent = send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: attempts == [1])
    move_to_another_server(monkeypatch)
    with pytest.raises(ServerChanged) as changed:
        runner.run_once()
    assert changed.value.now == "another server"
    runner._forget_server(changed.value.now)
    subscriber = runner.subscribers[0]
    assert not subscriber.partitions and not subscriber.deliveries.outstanding
    assert not subscriber.leases.owned
    release.set()  # the old delivery's handler acks ...
    cycle_until(runner, lambda: subscriber.stats["abandoned"] == 1)
    # ... which is not written: the message is delivered again on the "new" server.
    assert not DeliveryState.objects.filter(message_offset=sent.offset, acked=True).exists()
    cycle_until(runner, lambda: attempts == [1, 2])
    release_again.set()
    cycle_until(runner, lambda: DeliveryState.objects.filter(
        message_offset=sent.offset, acked=True).exists() or subscriber.stats["acked"] >= 1)


def test_a_fence_on_another_server_writes_nothing(
        register: Any, runner_of_g: Callable[[], Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    runner = runner_of_g()
    send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(handled))
    subscriber = runner.subscribers[0]
    written: list[str] = []
    store_class = type(store_for(connection))
    for statement in ("write_outcomes", "mark_delivered", "advance_watermarks"):
        original = getattr(store_class, statement)

        def spy(self: Any, *args: Any, _original: Any = original, _name: str = statement,
                **kwargs: Any) -> Any:
            written.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(store_class, statement, spy)
    move_to_another_server(monkeypatch)
    with connection.cursor() as cursor, pytest.raises(ServerChanged):
        runner.transactions.deliver(subscriber, cursor, [], Head(lambda: 0), None)
    assert written == []


def test_a_watermark_that_went_back_is_an_error(register: Any, runner_of_g: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A watermark read lower than the process had seen it (here an operator's rewind;
    a failover to a replica that was behind looks the same) is logged as an ERROR with
    its event, and the messages in between run again."""
    handled: list[int] = []
    register("t", "g", lambda m: handled.append(m.offset))
    sent = [send_message("t", n, partition_key="k") for n in range(3)]
    runner = runner_of_g()
    cycle_until(runner, lambda: PartitionOffset.objects.filter(
        consumer_group="g", offset_acked__gte=sent[-1].offset).exists())
    reset_position("g", "t", "k", deliver_from=sent[0].offset)
    with caplog.at_level(logging.ERROR, logger="sqlqueue.consumer"):
        cycle_until(runner, lambda: handled.count(sent[0].offset) == 2)
    (record,) = [r for r in caplog.records
                 if getattr(r, "event", None) == events.WATERMARK_WENT_BACK]
    assert (record.partition, record.seen, record.now) == (
        "k", sent[-1].offset, sent[0].offset - 1)


def test_an_offset_counter_that_went_back_is_an_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [0]
    watch = OffsetCounterWatch("default", lambda: now[0], interval_ms=1000)
    readings = iter([500, 700, 650, 660])
    monkeypatch.setattr(type(store_for(connection)), "offset_counter",
                        lambda self, cursor: next(readings))
    with caplog.at_level(logging.ERROR, logger="sqlqueue.consumer"):
        for _ in range(4):
            watch.run_due()
            watch.run_due()  # not due again before the interval: no reading
            now[0] += 1000
    (record,) = caplog.records
    assert (record.event, record.seen, record.now) == (
        events.OFFSET_COUNTER_WENT_BACK, 700, 650)
    assert watch.seen == 660


def test_the_offset_counter_only_grows_with_the_log() -> None:
    store = store_for(connection)
    first = send_message("t", 1, partition_key="k")
    with connection.cursor() as cursor:
        before = store.offset_counter(cursor)
    assert before is not None and before >= first.offset
    later = send_message("t", 2, partition_key="k")
    QueueMessage.objects.all().delete()  # an emptied log keeps its counter
    with connection.cursor() as cursor:
        after = store.offset_counter(cursor)
    assert after is not None and after >= later.offset and after > before


def test_a_lease_row_under_its_own_name_is_not_reported_as_lost_to_itself(
        register: Any, runner_of_g: Callable[[], Runner],
        caplog: pytest.LogCaptureFixture) -> None:
    """After a failover a subscriber may find its own name on a lease row of another
    generation (written by the old server): it lost the lease, but not "to" itself."""
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    runner = runner_of_g()
    send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(handled))
    subscriber = runner.subscribers[0]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE queue_partition_leases SET generation = generation + 1")
    with (caplog.at_level(logging.WARNING, logger="sqlqueue.consumer"),
          connection.cursor() as cursor):
        subscriber.fence(cursor)
    (lost,) = [r.getMessage() for r in caplog.records if "lost the lease" in r.getMessage()]
    assert f"to {subscriber.name!r}" not in lost
    assert "generation" in lost and "under this subscriber's name" in lost


def test_reconnect_attempts_are_at_most_two_seconds_apart(
        register: Any, runner_of_g: Callable[[], Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner whose database keeps failing (a failover under way) tries again every
    2 s at most, so that it notices the new primary soon after it accepts writes."""
    from django.db import OperationalError

    register("t", "g", lambda message: None)
    runner = runner_of_g()
    waits: list[float] = []

    def failing_cycle() -> float:
        raise OperationalError("the server is gone")

    def no_wait(timeout: float | None = None) -> bool:
        waits.append(float(timeout or 0))
        if len(waits) == 8:
            runner.stopping.set()
        return runner.stopping.is_set()

    monkeypatch.setattr(runner, "_cycle", failing_cycle)
    monkeypatch.setattr(runner.stopping, "wait", no_wait)
    runner.run(install_signal_handlers=False)
    assert waits[:3] == [0.5, 1.0, 2.0] and max(waits) == 2.0


def test_a_failover_voids_the_old_servers_leases_and_deliveries_at_once(
        register: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first runner that notices the change voids what the old server granted (issue
    39): the message in flight there is delivered again at once, not after its 60 s
    visibility timeout, under a lease of a new generation; a runner still holding an old
    lease fails its fence; a runner noticing later voids nothing more."""
    from sqlqueue.models import PartitionLease

    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to change")
    attempts: list[int] = []
    release = threading.Event()

    def handler(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt == 1:
            release.wait(30)
        connections.close_all()

    register("t", "g", handler)
    # An hour's visibility timeout: the second attempt can come only from the voided
    # delivery, never from the timeout passing, however slow the machine.
    made = [Runner(select_consumers(["g"]), conf=fast_settings(VISIBILITY_TIMEOUT=3600),
                   name=name) for name in ("first", "late")]
    first, late = made
    for runner in made:
        runner.start_handler_threads()
    try:
        send_message("t", {}, partition_key="k")
        cycle_until(first, lambda: attempts == [1])
        late.run_once()  # knows the old server too; holds nothing
        old = PartitionLease.objects.get(consumer_group="g", partition_key="k").generation
        move_to_another_server(monkeypatch)
        with caplog.at_level(logging.WARNING, logger="sqlqueue.consumer"):
            cycle_until(first, lambda: attempts == [1, 2], timeout=60,
                        what="the voided delivery to be delivered again")
            (voided,) = [r.getMessage() for r in caplog.records
                         if r.getMessage().startswith("Voided")]
            assert "1 lease(s) and 1 delivery(ies)" in voided
            assert PartitionLease.objects.get(
                consumer_group="g", partition_key="k").generation >= old + 2
            with connection.cursor() as cursor, pytest.raises(ServerChanged) as changed:
                late.server.head(storage.store(connection), cursor)  # (its cycle's first read)
            late._forget_server(changed.value.now)
        assert len([r for r in caplog.records if r.getMessage().startswith("Voided")]) == 1
        assert first.subscribers[0].leases.owned  # the new grants stay the new server's
    finally:
        release.set()
        for runner in made:
            runner.stop()
            runner.shutdown()


def test_a_stale_holder_cannot_write_after_the_void(
        register: Any, runner_of_g: Callable[[], Runner]) -> None:
    """A subscriber that still believes in a lease the old server granted (its connection
    reached the new server without it noticing) finds it voided at its fence."""
    from sqlqueue.consuming.takeover import void_old_server

    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to change")
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    runner = runner_of_g()
    send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(handled))
    subscriber = runner.subscribers[0]
    assert "k" in subscriber.partitions
    assert runner.server.server is not None
    assert void_old_server("default", runner.server.server, "another server") is not None
    with connection.cursor() as cursor:
        subscriber.fence(cursor)
    assert "k" not in subscriber.partitions and not subscriber.leases.owned
