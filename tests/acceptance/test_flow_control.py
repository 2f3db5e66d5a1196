"""Flow control with real ``runconsumer`` processes: pause and resume (SPEC §9)."""

from __future__ import annotations

import time

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.operations import flow
from sqlqueue.operations.lag import group_lag
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def calls(event: str) -> list[tuple[int, float]]:
    return list(HandlerCall.objects.filter(group="workers", event=event)
                .values_list("message_offset", "at"))


def test_a_paused_group_starts_nothing_new_and_resumes(processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"sleep": 0.2}, partition_key=f"k{n % 4}")
                                 for n in range(60)])
    process = runconsumer("--group", "workers", "--threads", "2", settings=FAST_LEASES)
    processes.append(process)
    wait_for(lambda: len(calls("started")) >= 4, what="the first handlers")

    assert flow.pause("workers", TOPIC, by="test")
    paused_at = time.monotonic()
    # In-flight handlers finish...
    wait_for(lambda: len(calls("finished")) == len(calls("started")), timeout=10,
             what="the running handlers to finish")
    # ... and, from 2 s after the pause on, none starts: watch for 4 s.
    wait_for(lambda: time.monotonic() > paused_at + 6, timeout=10)
    late = [offset for offset, at in calls("started") if at > paused_at + 2]
    assert late == [], f"started while paused: {late}"
    done = len(calls("finished"))
    assert done < len(sent), "the pause came too late to prove anything"
    assert group_lag("workers", TOPIC).status == "PAUSED"
    assert process.poll() is None

    assert flow.resume("workers", TOPIC)
    wait_for(lambda: len(calls("finished")) == len(sent), timeout=60,
             what="every message after the resume")
    assert sorted(o for o, _ in calls("finished")) == sorted(s.offset for s in sent)
    assert group_lag("workers", TOPIC).status in ("OK", "WARN")


def test_a_topic_wide_pause_holds_every_group(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key="k") for n in range(5)])
    flow.pause(topic=TOPIC)
    process = runconsumer("--threads", "2", settings=FAST_LEASES)
    processes.append(process)
    # Both groups hold their leases (not STOP) and start nothing.
    wait_for(lambda: group_lag("workers", TOPIC).held == 1
             and group_lag("auditors", TOPIC).held == 1, what="the leases")
    started_at = time.monotonic()
    wait_for(lambda: time.monotonic() > started_at + 2.5, timeout=5)
    assert HandlerCall.objects.count() == 0
    assert group_lag("workers", TOPIC).status == "PAUSED"
    assert group_lag("auditors", TOPIC).status == "PAUSED"
    flow.resume(topic=TOPIC)
    wait_for(lambda: HandlerCall.objects.filter(event="finished").count() == 10,
             what="both groups after the resume")
