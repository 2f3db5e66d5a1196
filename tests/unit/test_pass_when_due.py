"""When a pass records outcomes (``HandlerPool.outcomes_due``), the handler threads' work
queue (``WorkQueue``), and a window's open entries (``PartitionState.open_entries``). No
database: deliveries made by hand, threads that wait on events (never on a clock)."""

from __future__ import annotations

import queue
import random
import threading

import pytest

from sqlqueue.consuming.handlers import Outcome
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.workqueue import WorkQueue
from tests.unit.test_batch_units import row
from tests.unit.test_fairness import delivery, pool

pytestmark = pytest.mark.unit

WAIT = 10.0


def test_outcomes_wait_while_the_threads_have_queued_work() -> None:
    handlers = pool(threads=2)
    queued = [delivery("p", n) for n in range(10)]
    handlers.dispatch(queued)  # no thread started: all ten stay queued
    handlers.done.put(Outcome(queued[0], "ack"))
    # One of ten finished, eight more queued: a pass now would record one outcome.
    assert not handlers.outcomes_due()
    for made in queued[1:7]:
        handlers.done.put(Outcome(made, "ack"))
    assert not handlers.outcomes_due()  # seven of ten: the queue still holds work
    handlers.done.put(Outcome(queued[7], "ack"))
    assert handlers.outcomes_due()  # three quarters of what is in flight has finished


def test_outcomes_are_due_when_the_queue_runs_dry_or_a_pass_failed_to_record() -> None:
    handlers = pool(threads=4)
    made = [delivery("p", n) for n in range(10)]
    handlers.dispatch(made)
    handlers.done.put(Outcome(made[0], "ack"))
    while handlers.work.qsize() >= handlers.threads:  # the threads take work...
        handlers.work.get_nowait()
    assert handlers.outcomes_due()  # ...fewer wait than there are threads: refill now
    refilled = pool(threads=4)
    refilled.dispatch([delivery("p", n) for n in range(10)])
    refilled.keep_unrecorded([Outcome(made[1], "ack")])
    assert refilled.outcomes_due()  # an earlier pass could not record these


def test_a_finishing_handler_rings_only_once_outcomes_are_due() -> None:
    handlers = pool(threads=1)
    started, release = threading.Event(), threading.Event()

    def handler(message: object) -> None:
        started.set()
        release.wait(WAIT)

    from sqlqueue.consuming.registry import Consumer

    consumer = Consumer("t", "g", handler)
    made = [delivery("p", n, consumer=consumer) for n in range(6)]
    handlers.start()
    try:
        handlers.dispatch(made)
        assert started.wait(WAIT)
        handlers.wakeup.clear()
        release.set()  # the first finishes; five in flight, four queued behind one thread
        assert handlers.wakeup.wait(WAIT)  # rung: at the latest when the queue ran dry
        assert handlers.outcomes_due()
    finally:
        release.set()
        handlers.stop_threads()


def test_the_work_queue_hands_out_lowest_key_first_and_wakes_a_thread_per_item() -> None:
    work: WorkQueue[str] = WorkQueue()
    taken: queue.SimpleQueue[str] = queue.SimpleQueue()
    threads = [threading.Thread(target=lambda: taken.put(work.get()[1])) for _ in range(3)]
    for thread in threads:
        thread.start()
    work.put_many([((0, 2.0, 2), "c"), ((0, 1.0, 1), "b"), ((0, 1.0, 0), "a")])
    for thread in threads:
        thread.join(WAIT)
    assert sorted(taken.get_nowait() for _ in range(3)) == ["a", "b", "c"]
    work.put_many([((1, 0.0, 5), "low"), ((0, 9.0, 6), "high")])
    work.put(((0, 0.0, 7), "first"))
    assert [work.get_nowait()[1] for _ in range(3)] == ["first", "high", "low"]
    with pytest.raises(queue.Empty):
        work.get_nowait()
    assert work.empty() and work.qsize() == 0


def test_a_window_s_open_entries_are_its_entries_not_done() -> None:
    chance = random.Random(55)
    state = PartitionState("p", watermark=0)
    state.absorb([row(n) for n in range(1, 41)], "g")
    for step in range(400):
        open_offsets = sorted(state.open_entries)
        if chance.random() < 0.3:
            top = max(state.entries, default=0)
            state.absorb([row(top + n) for n in range(1, 4)], "g")
        elif open_offsets and chance.random() < 0.6:
            entry = state.entries[chance.choice(open_offsets)]
            if entry.in_flight:
                state.finished(entry.offset)
            else:
                state.dispatched(entry, visible_again_ms=1)
        elif state.entries:
            state.moved_watermark(state.advance_candidate(None))
        expected = {o for o, e in state.entries.items() if not e.done}
        assert set(state.open_entries) == expected, step
        assert all(state.open_entries[o] is state.entries[o] for o in expected)
        assert state.open_count == len(expected)
        assert state.in_flight_count == sum(1 for e in state.entries.values() if e.in_flight)
