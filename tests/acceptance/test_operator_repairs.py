"""Operator repairs while ``runconsumer`` holds the partition: the running subscriber must
let go, reload from the database and act on the repair (not undo it)."""

from __future__ import annotations

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.operations.positions import reset_position, retry_now
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def finished(**filters: object) -> list[int]:
    return sorted(HandlerCall.objects.filter(group="workers", event="finished", **filters)
                  .values_list("message_offset", flat=True))


def test_rewind_under_a_running_consumer_delivers_again(processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key="k")
                                 for n in range(3)])
    offsets = [s.offset for s in sent]
    processes.append(runconsumer("--group", "workers",
                                 settings={**FAST_LEASES, "RETENTION": 3600}))
    wait_for(lambda: finished() == offsets, what="the first pass")
    moved = reset_position("workers", TOPIC, "k", deliver_from=offsets[0])
    assert moved.watermark == offsets[0] - 1 and not moved.to_head
    wait_for(lambda: finished() == sorted(offsets + offsets), what="the replay after the rewind")


def test_retry_now_under_a_running_consumer(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({"fail_times": 1}, partition_key="k")])
    processes.append(runconsumer("--group", "workers", settings={
        **FAST_LEASES, "MIN_BACKOFF": 600, "MAX_BACKOFF": 900}))
    wait_for(lambda: HandlerCall.objects.filter(group="workers", event="started").exists(),
             what="the first attempt")
    # The first attempt failed; its retry is ten minutes away ...
    wait_for(lambda: retry_now("workers", TOPIC, "k") == 1, what="a message backing off")
    # ... and now happens within about one lease renewal.
    wait_for(lambda: bool(finished(attempt=2)), timeout=20, what="the retry")
