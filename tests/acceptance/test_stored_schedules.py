"""Issue 42: a schedule stored in the database, ticked by three real ``runconsumer``
processes that started before it existed: each tick is published exactly once, and a
pause from the admin's operations stops it within a reload."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import datetime

import pytest

from sqlqueue.models import QueueMessage
from sqlqueue.operations.stored_schedules import save_stored_schedule, set_paused
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.beats"
TICKS = 12


def ticks() -> list[str]:
    return [m["tick"] for m in QueueMessage.objects.filter(topic=TOPIC)
            .order_by("offset").values_list("metadata", flat=True)
            if m and m.get("schedule") == "stored-beat"]


class Quiet:
    """True once no new tick was published for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.count, self.since = -1, time.monotonic()

    def __call__(self) -> bool:
        count = len(ticks())
        if count != self.count:
            self.count, self.since = count, time.monotonic()
            return False
        return time.monotonic() - self.since >= self.seconds


def test_runners_pick_up_a_stored_schedule_and_publish_each_tick_once(
        processes: list) -> None:
    for name in ("one", "two", "three"):
        processes.append(runconsumer("--group", "workers", "--name", name,
                                     settings=FAST_LEASES))
    save_stored_schedule("stored-beat", {"topic": TOPIC, "every": 1, "catch_up": 5})
    wait_for(lambda: len(ticks()) >= TICKS, timeout=90, what=f"{TICKS} ticks")
    set_paused(["stored-beat"], True)
    # Within one reload (5 s) every runner stops publishing it.
    quiet = Quiet(3.0)
    wait_for(quiet, timeout=30, interval=0.5, what="the pause to be obeyed")
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        assert process.wait(30) == 0, process.communicate()

    seen = ticks()
    assert len(seen) == len(set(seen)), "a tick was published twice"
    moments = [datetime.fromisoformat(t).timestamp() for t in seen]
    gaps = [b - a for a, b in itertools.pairwise(moments) if b - a != 1]
    assert gaps == [], f"ticks missing between {seen[0]} and {seen[-1]}"
