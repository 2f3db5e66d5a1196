"""A delivery's visibility timeout is checked again just before its handler is called
(guarantee I10): a handler thread takes a delivery in time, but what comes between (an
``atomic=True`` handler's transaction opening on a busy database, a thread descheduled)
may outlast what was left of the timeout, by when the message may be delivered again.
Then the handler is not called and the delivery is given back (no attempt charged)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections

from sqlqueue import Message, storage
from sqlqueue.consuming import handlers
from sqlqueue.consuming.handlers import Delivery, Unchecked
from sqlqueue.consuming.registry import Consumer
from tests.engine.harness import ALIASES, memory_queue
from tests.unit.test_consuming_units import row


class ExpiresAfterTheThreadTookIt(Unchecked):
    """Within the timeout when the thread takes the delivery; past it a moment later."""

    def __init__(self) -> None:
        self.asked = 0

    def may_start(self, delivery: Delivery) -> bool:
        self.asked += 1
        return self.asked == 1


@pytest.fixture
def alias() -> Iterator[str]:
    with memory_queue():
        yield ALIASES[0]


@pytest.mark.parametrize("atomic", [False, True])
def test_a_delivery_past_its_timeout_by_the_time_its_handler_would_run_is_given_back(
        alias: str, atomic: bool) -> None:
    called: list[Message] = []
    view = ExpiresAfterTheThreadTookIt()
    delivery = Delivery(Consumer("t", "g", called.append, atomic=atomic), alias, "k", row(1),
                        1, 0, view=view)
    assert delivery.start()  # in time when the thread took it
    outcome = handlers.handle(delivery)
    assert outcome.kind == "not_started"
    assert called == [] and view.asked == 2
    assert not connections[alias].in_atomic_block  # the atomic one's transaction closed


@pytest.mark.parametrize("atomic", [False, True])
def test_a_delivery_still_within_its_timeout_runs(alias: str, atomic: bool) -> None:
    called: list[Message] = []
    delivery = Delivery(Consumer("t", "g", called.append, atomic=atomic), alias, "k", row(1),
                        1, 0)
    with connections[alias].cursor() as cursor:  # as a subscriber marks what it delivers
        storage.store(alias).mark_delivered(cursor, "g", "t", [("k", 1, 0)])
    assert delivery.start()
    assert handlers.handle(delivery).kind == ("acked" if atomic else "ack")
    assert [m.offset for m in called] == [1]
