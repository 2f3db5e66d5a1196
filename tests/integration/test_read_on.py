"""A subscriber reads on through rows that are done already, without waiting a poll
interval for every batch: rows its partition's previous holder acked above the durable
watermark (after a crash or a rebalance), and rows addressed to another group (a
replayed dead letter)."""

from __future__ import annotations

from typing import Any

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.consuming.delivering import READ_ON_FETCHES, READ_ON_WIDEST
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import DeliveryState, QueueMessage
from tests.integration.consuming_helpers import fast_settings, register, run_until

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture

#: Long enough that a pass which waited for the next poll would show in its delay.
POLL_INTERVAL = 5.0
BATCH = 10  # the default batch size
#: What one pass reads at most: READ_ON_FETCHES fetches, doubling from one batch.
ONE_PASS = sum(min(BATCH * 2 ** n, BATCH * READ_ON_WIDEST) for n in range(READ_ON_FETCHES))


class Calls:
    def __init__(self) -> None:
        self.offsets: list[int] = []

    def __call__(self, message: Any) -> None:
        self.offsets.append(message.offset)


def acked_above_the_watermark(done: int) -> int:
    """``done`` messages of partition k acked for group g with the watermark still at 0,
    as a holder leaves them that stopped before moving it; then one message not done.
    Returns its offset."""
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(done + 1)])
    DeliveryState.objects.bulk_create([
        DeliveryState(consumer_group="g", topic="t", partition_key="k",
                      message_offset=message.offset, acked=True)
        for message in sent[:done]])
    return sent[-1].offset


def run(runner: Runner, delivered: Calls) -> list[float | None]:
    """Passes until one handed a message to the handlers (how many passes the reading
    took: how soon a handler thread then runs it is another matter); the delay each pass
    asked for. Then the handler's run, waited for."""
    runner.start_handler_threads()
    try:
        delays = run_until(runner, lambda: runner.pool.dispatched > 0)
        run_until(runner, lambda: bool(delivered.offsets))
        return delays
    finally:
        runner.stop()
        runner.shutdown()


def test_a_new_holder_reads_through_what_its_predecessor_acked(register: Any) -> None:
    delivered = register("t", "g", Calls())
    done = 2 * ONE_PASS + 5  # three passes' worth of reading
    last = acked_above_the_watermark(done)
    runner = Runner(select_consumers(["g"]), conf=fast_settings(POLL_INTERVAL=POLL_INTERVAL))
    delays = run(runner, delivered)
    assert delivered.offsets == [last]  # nothing acked delivered again
    # Ten rows a pass, a poll interval apart, would take done / 10 passes.
    assert len(delays) <= 3, delays
    assert delays[:-1] == [0.0] * (len(delays) - 1), delays  # no pass waited to read on


def test_rows_addressed_to_another_group_are_read_through(register: Any) -> None:
    """A dead letter replayed for one group is a row every other group skips."""
    delivered = register("t", "g", Calls())
    replayed = send_messages("t", [OutgoingMessage(n, partition_key="k")
                                   for n in range(ONE_PASS + 5)])
    QueueMessage.objects.filter(offset__in=[m.offset for m in replayed]).update(
        consumer_group="other")
    [mine] = send_messages("t", [OutgoingMessage("mine", partition_key="k")])
    runner = Runner(select_consumers(["g"]), conf=fast_settings(POLL_INTERVAL=POLL_INTERVAL))
    delays = run(runner, delivered)
    assert delivered.offsets == [mine.offset]
    assert len(delays) <= 2, delays
    assert delays[:-1] == [0.0] * (len(delays) - 1), delays


def test_a_full_buffer_of_open_rows_does_not_read_on(register: Any) -> None:
    """Reading on is for rows already done: a batch of open rows fills the buffer, and
    the next fetch waits until the handlers have taken some (no unbounded reads)."""
    register("t", "g", Calls())
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(200)])
    runner = Runner(select_consumers(["g"]), conf=fast_settings(POLL_INTERVAL=POLL_INTERVAL))
    subscriber = runner.subscribers[0]
    runner.run_once()  # leases, then one fetch of one batch; no handler thread runs
    [state] = subscriber.partitions.values()
    assert len(state.entries) == BATCH
    assert not subscriber.fetcher.reads_on()
    runner.shutdown()
