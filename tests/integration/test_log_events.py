"""Stable log event names with structured fields (sqlqueue.events), as a JSON formatter
would print them."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import sqlqueue
from sqlqueue import events, send_message
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]
FIELDS = ("group", "topic", "partition", "offset", "attempt")


def as_json(record: logging.LogRecord) -> dict[str, Any]:
    """What a JSON formatter keeps: the record's attributes beyond the standard ones."""
    standard = set(vars(logging.makeLogRecord({})))
    return json.loads(json.dumps({k: v for k, v in vars(record).items()
                                  if k not in standard and k != "message"}, default=str))


def test_events_and_fields(register: Any, caplog: pytest.LogCaptureFixture) -> None:
    def handler(message: sqlqueue.Message) -> None:
        if message.attempt == 1:
            raise RuntimeError("boom")
        raise sqlqueue.Reject("no more")

    register("t", "g", handler)
    sent = send_message("t", 1, partition_key="k")
    with caplog.at_level(logging.DEBUG, logger="sqlqueue"):
        drain(["g"])
    by_event: dict[str, list[dict[str, Any]]] = {}
    for record in caplog.records:
        if hasattr(record, "event"):
            by_event.setdefault(record.event, []).append(as_json(record))
    assert set(by_event) <= set(events.EVENTS)
    failed, = by_event[events.HANDLER_FAILED]
    assert {k: failed[k] for k in FIELDS} == {"group": "g", "topic": "t", "partition": "k",
                                              "offset": sent.offset, "attempt": 1}
    assert "boom" in failed["error"]
    assert failed["subject"] == ""  # a plain handler names no task (see test_tasks)
    dead, = by_event[events.MESSAGE_DEAD_LETTERED]
    assert {k: dead[k] for k in FIELDS} == {"group": "g", "topic": "t", "partition": "k",
                                            "offset": sent.offset, "attempt": 2}
    handled = by_event[events.MESSAGE_HANDLED]
    assert [(h["attempt"], h["outcome"]) for h in handled] == [(1, "fail"), (2, "reject")]
    assert all(h["duration"] >= 0 and h["offset"] == sent.offset for h in handled)
    assert by_event[events.LEASES_CHANGED][0]["gained"] == 1
    started, = by_event[events.RUNNER_STARTED]
    assert started["subscriptions"] == ["g:t"] and started["threads"] >= 1
