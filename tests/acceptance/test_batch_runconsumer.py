"""A batch consumer (``@sqlqueue.batch_consumer``) drained by a real ``manage.py
runconsumer --until-empty`` process: every message handled once, in calls of at most
``max_batch``, the banner says it is a batch consumer, and the summary counts messages."""

from __future__ import annotations

import pytest

from sqlqueue import OutgoingMessage, send_messages
from tests.acceptance.processes import runconsumer
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)


def test_runconsumer_drains_a_batch_group(processes: list) -> None:
    sent = send_messages("accept.batch", [
        OutgoingMessage({"n": n}, partition_key=f"k{n % 4}") for n in range(230)])
    process = runconsumer("--group", "batchers", "--until-empty", "--threads", "2")
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "    group 'batchers' on topic 'accept.batch' (batch consumer, max_batch 50)" in out
    assert "batchers:accept.batch: 230 acked, 0 retried, 0 dead-lettered" in out
    calls = HandlerCall.objects.filter(group="batchers")
    assert sorted(calls.values_list("message_offset", flat=True)) == sorted(
        s.offset for s in sent)
    sizes = {int(event.split(":")[1]) for event in calls.values_list("event", flat=True)}
    assert max(sizes) <= 50
    assert calls.count() == 230 and set(calls.values_list("attempt", flat=True)) == {1}
