"""``rate_limit`` and ``max_in_flight`` across ``runconsumer`` processes (#17).

The handlers (tests/testapp/consumers.py) journal when they start and finish, on the
monotonic clock, which all processes on one machine share."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.db import connection

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import PartitionLease
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
RATE = 30  # @consumer("accept.limited", rate_limit=30)
MAX_IN_FLIGHT = 3  # @consumer("accept.bounded", max_in_flight=3)
PARTITIONS = 6


def start(group: str, count: int, processes: list) -> list[subprocess.Popen[str]]:
    started = [runconsumer("--group", group, "--threads", "4", settings=FAST_LEASES)
               for _ in range(count)]
    processes.extend(started)
    return started


def split_among(group: str, count: int) -> bool:
    """Every partition leased, by ``count`` subscribers holding equal shares."""
    owners = list(PartitionLease.objects.filter(consumer_group=group)
                  .values_list("leased_by", flat=True))
    return (len(owners) == PARTITIONS and len(set(owners)) == count
            and all(owners.count(o) == PARTITIONS // count for o in set(owners)))


def starts(group: str) -> list[float]:
    return sorted(HandlerCall.objects.filter(group=group, event="started")
                  .values_list("at", flat=True))


@pytest.mark.parametrize("count", [1, 3])
def test_the_rate_limit_holds_for_the_group_within_10_percent(count: int,
                                                              processes: list) -> None:
    # A backlog for 25 s at the limit; measured over 10 s once the partitions are split.
    send_messages("accept.limited", [OutgoingMessage({}, partition_key=f"k{n % PARTITIONS}")
                                     for n in range(RATE * 25)])
    start("limited", count, processes)
    wait_for(lambda: split_among("limited", count), timeout=30, what="the leases to split")
    since = time.monotonic()
    wait_for(lambda: max(starts("limited"), default=0) >= since + 10, timeout=30,
             what="ten seconds of handling")
    measured = [at for at in starts("limited") if since <= at < since + 10]
    rate = len(measured) / 10
    assert rate <= RATE * 1.1, f"{rate:.1f}/s with {count} process(es): over the limit"
    # Below the limit means the processes could not keep up, not that the limit is wrong:
    # three processes on one SQLite file share its single write lock, and on a loaded CI
    # machine (load 10 on 2 cores) they measured 24/s. Elsewhere the limit must be reached.
    lowest = 0.5 if connection.vendor == "sqlite" and count > 1 else 0.9
    assert rate >= RATE * lowest, f"{rate:.1f}/s with {count} process(es): under the limit"


def most_at_once(group: str) -> int:
    """The most handlers of ``group`` running at any one time, from their journal."""
    events = sorted((at, 1 if event == "started" else -1) for at, event in
                    HandlerCall.objects.filter(group=group).values_list("at", "event"))
    running = most = 0
    for _, change in events:  # at a tie a finish (-1) sorts first: it frees its place
        running += change
        most = max(most, running)
    return most


def test_max_in_flight_is_never_exceeded_across_processes(processes: list) -> None:
    sent = send_messages("accept.bounded", [
        OutgoingMessage({"sleep": 0.1}, partition_key=f"k{n % PARTITIONS}")
        for n in range(90)])
    start("bounded", 3, processes)
    wait_for(lambda: HandlerCall.objects.filter(group="bounded", event="finished").count()
             == len(sent), timeout=120, what="every message handled")
    most = most_at_once("bounded")
    assert 2 <= most <= MAX_IN_FLIGHT, f"{most} handlers at once"
    # Nothing held back was charged an attempt: every message ran once, on attempt 1.
    attempts = list(HandlerCall.objects.filter(group="bounded", event="started")
                    .values_list("attempt", flat=True))
    assert sorted(attempts) == [1] * len(sent)
