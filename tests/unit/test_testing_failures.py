"""What ``run_consumers`` reports of a handler that raised (issue 53, trial F4/F5): the
outcome carries the exception, and ``HandlerFailure`` the message, the exception and its
traceback; ``Retry`` and ``Reject`` are the handler's answers, not failures."""

from __future__ import annotations

import sqlqueue
from sqlqueue.consuming import handlers
from sqlqueue.consuming.handlers import Delivery
from sqlqueue.consuming.registry import Consumer, Handler
from sqlqueue.testing import HandlerFailure
from tests.unit.test_consuming_units import row


def handled(handler: Handler, **row_values: object) -> handlers.Outcome:
    delivery = Delivery(Consumer("shop.orders", "billing", handler), "default", "k-1",
                        row(7, **row_values), 2, 0)
    assert delivery.start()
    return handlers.handle(delivery)


def broken(message: sqlqueue.Message) -> None:
    raise KeyError("missing_key")


def test_a_failure_keeps_the_message_the_exception_and_the_traceback() -> None:
    outcome = handled(broken, payload=b'{"n": 1}', metadata='{"trace": "t-1"}')
    assert (outcome.kind, type(outcome.exception)) == ("fail", KeyError)

    failure = HandlerFailure.of(outcome)

    assert failure.exception is outcome.exception
    assert (failure.message.topic, failure.message.partition_key, failure.message.offset,
            failure.message.attempt, failure.message.consumer_group) == (
        "shop.orders", "k-1", 7, 2, "billing")
    assert (failure.message.payload, failure.message.metadata) == ({"n": 1}, {"trace": "t-1"})
    assert 'in broken\n    raise KeyError("missing_key")' in failure.traceback
    assert failure.traceback.endswith("KeyError: 'missing_key'\n")
    assert repr(failure) == ("HandlerFailure(shop.orders/k-1@7 for 'billing', attempt 2: "
                             "KeyError('missing_key'))")


def test_answers_are_not_failures() -> None:
    def retry(message: sqlqueue.Message) -> None:
        raise sqlqueue.Retry(delay=5)

    def reject(message: sqlqueue.Message) -> None:
        raise sqlqueue.Reject("no such order")

    assert [(o.kind, o.exception) for o in (handled(retry), handled(reject))] == [
        ("retry", None), ("reject", None)]


def test_a_message_whose_metadata_is_not_json_is_reported_without_it() -> None:
    # Written by another program (SQLite stores any text): the handler never ran.
    called: list[sqlqueue.Message] = []
    outcome = handled(called.append, metadata="{not json")
    failure = HandlerFailure.of(outcome)
    assert called == [] and isinstance(failure.exception, ValueError)
    assert (failure.message.offset, failure.message.metadata) == (7, {})


def test_a_long_exception_is_cut_in_the_repr_not_in_the_traceback() -> None:
    def loud(message: sqlqueue.Message) -> None:
        raise ValueError("x" * 5000)

    failure = HandlerFailure.of(handled(loud))
    assert len(repr(failure)) < 300 and repr(failure).endswith("...)")
    assert "x" * 5000 in failure.traceback
