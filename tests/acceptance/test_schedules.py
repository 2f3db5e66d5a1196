"""Schedules with real ``runconsumer`` processes: three of them tick one schedule for 30
seconds, one is killed with SIGKILL and replaced on the way, and every tick is
published exactly once (SPEC §9 "Schedules")."""

from __future__ import annotations

import itertools
import signal
from datetime import datetime

import pytest

from sqlqueue.models import QueueMessage
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.beats"
SECONDS = 30
CATCH_UP = 2 * SECONDS


def ticks(topic: str) -> list[str]:
    return [m["tick"] for m in QueueMessage.objects.filter(topic=topic)
            .order_by("offset").values_list("metadata", flat=True)
            if m and m.get("schedule") == "beat"]


# A message schedule, whose message ids also name the tick (a duplicate would be absorbed
# by the idempotency window too), and a task schedule, whose messages have random ids: there
# only the claim on the schedule's row stands between two processes and a double run.
# catch_up as long as the test: however long the processes are held up (a loaded CI
# machine: a gap of one tick after 6 s without a publish was seen with catch_up 5, which
# skips older ticks by design), every tick is still published, so that a gap below is a
# lost tick, not a slow one.
@pytest.mark.parametrize(("entry", "topic"), [
    ({"topic": TOPIC, "payload": {"hello": "world"}}, TOPIC),
    ({"task": "tests.testapp.tasks.add", "args": [1, 2]}, "tasks.default"),
], ids=["message", "task"])
def test_three_processes_publish_each_tick_exactly_once(
    processes: list, entry: dict[str, object], topic: str
) -> None:
    if "task" in entry:
        pytest.importorskip("sqlqueue.integrations.tasks.compat")
    settings = {**FAST_LEASES, "SCHEDULES": {"beat": {**entry, "every": 1,
                                                       "catch_up": CATCH_UP}}}
    for name in ("one", "two", "three"):
        processes.append(runconsumer("--group", "workers", "--name", name, settings=settings))
    wait_for(lambda: len(ticks(topic)) >= SECONDS // 3, timeout=60, what="the first ticks")
    processes[0].send_signal(signal.SIGKILL)  # dies between ticks, or in the middle of one
    processes[0].wait(10)
    processes.append(runconsumer("--group", "workers", "--name", "four", settings=settings))
    wait_for(lambda: len(ticks(topic)) >= SECONDS, timeout=90, what=f"{SECONDS} ticks")
    for process in processes[1:]:
        process.send_signal(signal.SIGTERM)
    for process in processes[1:]:
        assert process.wait(30) == 0, process.communicate()

    seen = ticks(topic)
    assert len(seen) == len(set(seen)), "a tick was published twice"
    moments = [datetime.fromisoformat(t).timestamp() for t in seen]
    assert moments == sorted(moments)
    gaps = [b - a for a, b in itertools.pairwise(moments) if b - a != 1]
    assert gaps == [], f"ticks missing between {seen[0]} and {seen[-1]}"
    ids = list(QueueMessage.objects.filter(topic=topic).values_list("id", flat=True))
    assert len(ids) == len(set(ids))
