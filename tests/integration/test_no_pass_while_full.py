"""A partition with no room for another delivery does not make the runner pass again at
once: the messages waiting behind its runs are not "due now" while those runs go on.

Before, a slow ordered handler (or an unordered partition with ``batch_size`` runs going)
made every pass ask for the next one at once: a waiting message looked due, though
nothing could start before a run ended. The runner then passed back to back for as long
as the handler ran (a third of a core for one ordered handler sleeping 0.2 s)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from tests.integration.consuming_helpers import fast_settings, register, run_until

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture

POLL_INTERVAL = 2.0  # long: a pass that waits shows it in its delay


class Blocking:
    """A handler that runs until released (but for the first ``free`` messages)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.started: list[int] = []
        self.release = threading.Event()

    def __call__(self, message: Any) -> None:
        self.started.append(message.payload)
        if message.payload >= self.free:
            assert self.release.wait(30)


def delays_while_running(register: Any, *, ordered: bool, batch_size: int, free: int,
                         messages: int) -> tuple[list[float | None], Blocking]:
    """Passes until ``free`` messages were handled and the partition's room is taken by
    runs that go on, with messages read and waiting behind them; then three more
    passes, whose delays are returned."""
    handler = register("t", "g", Blocking(free), ordered=ordered, batch_size=batch_size)
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(messages)])
    runner = Runner(select_consumers(["g"]),
                    conf=fast_settings(POLL_INTERVAL=POLL_INTERVAL, THREADS=batch_size))
    runner.start_handler_threads()
    try:
        room = 1 if ordered else batch_size
        run_until(runner, lambda: len(handler.started) == free + room)
        (state,) = runner.subscribers[0].partitions.values()
        waiting = [e for e in state.entries.values() if not e.done and not e.in_flight]
        assert waiting, "nothing read and waiting behind the runs"
        return [runner.run_once() for _ in range(3)], handler
    finally:
        handler.release.set()
        runner.stop()
        runner.shutdown()


def test_an_ordered_run_going_does_not_make_passes_back_to_back(register: Any) -> None:
    delays, handler = delays_while_running(register, ordered=True, batch_size=10, free=0,
                                           messages=3)
    assert handler.started == [0]  # one run at a time
    assert all(delay is not None and delay > 0 for delay in delays), delays


def test_a_full_unordered_partition_does_not_make_passes_back_to_back(
        register: Any) -> None:
    # Two of the first four finish at once: the buffer, half open, reads four more, and
    # two of them start beside the two runs that go on; two wait.
    delays, handler = delays_while_running(register, ordered=False, batch_size=4, free=2,
                                           messages=10)
    assert sorted(handler.started) == [0, 1, 2, 3, 4, 5]
    assert all(delay is not None and delay > 0 for delay in delays), delays
