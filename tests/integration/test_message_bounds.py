"""Issue 53, W5 (SPEC §11): nothing a message asks for holds its partition, or garbage
collection of that partition, for more than 100 years. A message not yet due holds an
ordered partition until it is due, and keeps every group's watermark below it: ``delay``
was capped at a century, ``deliver_at`` accepted any date up to the year 9999."""

from __future__ import annotations

import inspect
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sqlqueue import InvalidMessage, OutgoingMessage, send_message, send_messages
from sqlqueue.consuming.handlers import MAX_RETRY_DELAY
from sqlqueue.models import QueueMessage
from sqlqueue.storage.sql import store_for

pytestmark = pytest.mark.django_db(transaction=True)
CENTURY = timedelta(days=100 * 365)
#: a message's arguments that say when it may be delivered, and values beyond the bound
BEYOND: dict[str, list[Any]] = {
    "delay": [CENTURY + timedelta(seconds=1), CENTURY.total_seconds() + 1, 1e308],
    "deliver_at": [lambda: timezone.now() + CENTURY + timedelta(days=1),
                   lambda: datetime(9999, 1, 1, tzinfo=UTC),
                   lambda: datetime.max.replace(tzinfo=UTC)],
}
#: the same arguments at the bound, accepted
AT_THE_BOUND: dict[str, Any] = {
    "delay": lambda: CENTURY,
    "deliver_at": lambda: timezone.now() + CENTURY - timedelta(minutes=1),
}
TIME_WORDS = ("datetime", "timedelta", "float")


def db_now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def value_of(value: Any) -> Any:
    return value() if callable(value) else value


def test_every_time_a_message_can_ask_for_is_bounded_here() -> None:
    """A new argument saying when a message is delivered must join these tests."""
    message_fields = {f.name for f in fields(OutgoingMessage)
                      if any(word in str(f.type) for word in TIME_WORDS)}
    arguments = {name for name, parameter in inspect.signature(send_message).parameters.items()
                 if any(word in str(parameter.annotation) for word in TIME_WORDS)}
    assert message_fields == arguments == set(BEYOND) == set(AT_THE_BOUND)
    # What a handler asks for (Retry(delay=...)) is bounded lower still.
    assert CENTURY.total_seconds() >= MAX_RETRY_DELAY


@pytest.mark.parametrize(("field", "index"), [(f, i) for f, values in BEYOND.items()
                                              for i in range(len(values))])
def test_a_message_asking_for_more_than_a_century_is_refused(field: str, index: int) -> None:
    value = value_of(BEYOND[field][index])
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidMessage, match=rf"{field}.*more than a century"):
            send_message("bounds", {}, partition_key="k", **{field: value})
        with pytest.raises(InvalidMessage, match=rf"message 1: {field}.*more than a century"):
            send_messages("bounds", [OutgoingMessage({}), OutgoingMessage({}, **{field: value})])
    assert len(queries) == 0
    assert not QueueMessage.objects.exists()


@pytest.mark.parametrize("field", sorted(AT_THE_BOUND))
def test_a_message_at_the_bound_is_kept_no_longer_than_a_century(field: str) -> None:
    sent = send_message("bounds", {}, partition_key="k", **{field: value_of(AT_THE_BOUND[field])})
    stored = QueueMessage.objects.get(offset=sent.offset)
    latest = db_now_ms() + round(CENTURY.total_seconds() * 1000)
    # Due about a century from now, never later (a minute for the two clocks' gap).
    assert latest - 2 * 60_000 <= stored.deliver_after <= latest + 60_000


def test_a_task_cannot_be_deferred_for_more_than_a_century() -> None:
    """A task's ``run_after`` is its message's ``deliver_at``."""
    pytest.importorskip("sqlqueue.integrations.tasks.compat")
    from sqlqueue.integrations.tasks.models import TaskRecord
    from tests.testapp import tasks

    later = tasks.add.using(run_after=timezone.now() + CENTURY + timedelta(days=1))
    with pytest.raises(InvalidMessage, match=r"deliver_at.*more than a century"):
        later.enqueue(1, 2)
    assert not TaskRecord.objects.exists() and not QueueMessage.objects.exists()
