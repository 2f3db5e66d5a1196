"""Every time a cycle stamps is read after the statements that may wait (issue 22).

A statement that waits for a lock (a peer paused inside its transaction on MySQL, a
writer holding SQLite's database lock) is simulated by a statement that takes 0.6 s,
longer than the re-stamping threshold. The stamps are checked against the database's
clock read by the handler once the message reached it. tests/acceptance/test_lock_waits.py
shows the same with real row locks and a real ``runconsumer``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, connections

import sqlqueue
from sqlqueue import Message, send_message
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.consuming.server import Head
from sqlqueue.models import DeliveryState
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import fast_settings, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture
WAIT = 0.6  # seconds a slowed statement takes: more than RESTAMP_AFTER_MS
TOLERANCE_MS = 100  # the clock's extrapolation is ahead by at most a round trip


def db_now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def db_now_ms_at_call() -> int:
    """The database's clock when this was called, though a handler thread opens its
    connection first (tens of milliseconds on a loaded machine): the reading less the
    time it took to get it."""
    called = time.monotonic()
    read = db_now_ms()
    return read - round((time.monotonic() - called) * 1000)


def slowed(monkeypatch: pytest.MonkeyPatch, statement: str) -> list[float]:
    """Make the first call of ``Store.<statement>`` take ``WAIT`` seconds, as a lock
    wait would (a statement repeated in the same transaction then holds the locks and
    does not wait again); returns the calls (grows as it is called), each as the time
    (epoch ms, this machine's clock, which is the test databases' too) when the
    statement went ahead after its wait: nothing stamped after it may count from before."""
    store_class = type(store_for(connection))
    original = getattr(store_class, statement)
    calls: list[float] = []

    def waiting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not calls:
            time.sleep(WAIT)  # the simulated lock wait (the fault, not a synchronisation)
        calls.append(time.time() * 1000)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(store_class, statement, waiting)
    return calls


@pytest.fixture
def runner_for() -> Iterator[Callable[..., Runner]]:
    made: list[Runner] = []

    def make(group: str, **settings: Any) -> Runner:
        runner = Runner(select_consumers([group]), conf=fast_settings(**settings))
        runner.start_handler_threads()
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.stop()
        runner.shutdown()


def cycle_until(runner: Runner, condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        runner.run_once()
        time.sleep(0.01)


def test_a_delivery_whose_mark_waited_is_invisible_for_the_whole_timeout(
        register: Any, runner_for: Callable[..., Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    started_at: list[int] = []
    release = threading.Event()

    def handler(message: Message) -> None:
        started_at.append(db_now_ms_at_call())
        try:
            release.wait(30)
        finally:
            connections.close_all()

    register("t", "g", handler)
    runner = runner_for("g", VISIBILITY_TIMEOUT=30)
    marks = slowed(monkeypatch, "mark_delivered")
    sent = send_message("t", {}, partition_key="k")
    try:
        cycle_until(runner, lambda: bool(started_at))
        assert marks
        # Counted from when the mark went ahead after its wait, not from before it (the
        # handler's own start may come later still on a loaded machine: not a bound).
        waited_until = marks[0]
        state = DeliveryState.objects.get(consumer_group="g", message_offset=sent.offset)
        # In the database (what another owner would go by) and in this process's view.
        assert state.invisible_until >= waited_until + 30_000 - TOLERANCE_MS
        entry = runner.subscribers[0].partitions["k"].entries[sent.offset]
        assert entry.visible_again_ms >= waited_until + 30_000 - TOLERANCE_MS
    finally:
        release.set()


def test_a_backoff_whose_write_waited_is_not_cut_short(
        register: Any, runner_for: Callable[..., Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def handler(message: Message) -> None:
        attempts.append(message.attempt)
        raise sqlqueue.Retry(delay=20)

    register("t", "g", handler)
    runner = runner_for("g")
    sent = send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(attempts))
    settles = slowed(monkeypatch, "write_outcomes")
    cycle_until(runner, lambda: bool(settles))  # the outcome recorded, slowly
    # Counted from after the wait (a time read after the pass, as before, raced the
    # pass's end on a loaded machine); from before it, it would be WAIT short.
    waited_until = settles[0]
    state = DeliveryState.objects.get(consumer_group="g", message_offset=sent.offset)
    assert state.invisible_until >= waited_until + 20_000 - TOLERANCE_MS
    entry = runner.subscribers[0].partitions["k"].entries[sent.offset]
    assert entry.due_ms >= waited_until + 20_000 - TOLERANCE_MS


def test_covered_at_is_read_after_the_head(register: Any, runner_for: Callable[..., Runner],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The late-commit window may close once every transaction open at ``covered_at_ms``
    # has ended: a time from before the head was read would let it close over a
    # publisher that was still open when the head passed its offset (guarantee I4).
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    runner = runner_for("g")
    send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(handled))
    subscriber = runner.subscribers[0]
    state = subscriber.partitions["k"]
    later = send_message("t", {}, partition_key="other")
    clock_ms = [db_now_ms()]
    subscriber.clock = subscriber.fetcher.clock = lambda: clock_ms[0]

    def head_read_after_a_wait() -> int:
        clock_ms[0] += 5_000  # the head is read 5 s after the cycle began
        return later.offset

    connection_ = connections[runner.alias]
    with connection_.cursor() as cursor:
        subscriber.poll(cursor, Head(head_read_after_a_wait), None)
    assert state.covered >= later.offset
    assert state.covered_at_ms == clock_ms[0]  # read after the head, not before


def lock_wait_error() -> OperationalError:
    """What the database raises when a bounded lock wait gives up."""
    if connection.vendor == "mysql":
        return OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")
    if connection.vendor == "postgresql":
        from psycopg.errors import LockNotAvailable

        cause = LockNotAvailable("canceling statement due to lock timeout")
        error = OperationalError(str(cause))
        error.__cause__ = cause  # as Django wraps the driver's error
        return error
    return OperationalError("database is locked")


def test_a_pass_that_gives_up_a_lock_wait_keeps_its_outcomes(
        register: Any, runner_for: Callable[..., Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    handled: list[int] = []
    register("t", "g", lambda message: handled.append(message.offset))
    runner = runner_for("g")
    sent = send_message("t", {}, partition_key="k")
    cycle_until(runner, lambda: bool(handled))
    deadline = time.monotonic() + 10
    while runner.pool.done.empty():  # the handler's outcome is back, not yet recorded
        assert time.monotonic() < deadline
        time.sleep(0.01)
    subscriber = runner.subscribers[0]
    fence, failures = type(subscriber).fence, []

    def fence_giving_up_once(self: Any, cursor: Any) -> None:
        if not failures:
            failures.append(1)
            raise lock_wait_error()
        fence(self, cursor)

    monkeypatch.setattr(type(subscriber), "fence", fence_giving_up_once)
    cycle_until(runner, lambda: bool(failures))
    assert runner.pool.unrecorded  # the ack was not written, and not dropped either
    assert not DeliveryState.objects.filter(message_offset=sent.offset, acked=True).exists()
    cycle_until(runner, lambda: DeliveryState.objects.filter(
        message_offset=sent.offset, acked=True).exists() or reached_watermark(sent.offset))
    assert not runner.pool.unrecorded
    assert handled == [sent.offset]  # acked, never delivered again


def reached_watermark(offset: int) -> bool:
    from sqlqueue.models import PartitionOffset

    return PartitionOffset.objects.filter(consumer_group="g", offset_acked__gte=offset).exists()
