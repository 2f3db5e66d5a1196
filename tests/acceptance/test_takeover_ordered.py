"""Issue 51, first part: an ordered partition taken over from a holder frozen past its
lease while its handler runs, with a lower offset committing late meanwhile (the wave-4
rerun's ``exp_f``, section F of research/wave4-topologies.md).

Before the fix the new holder started the late-committed lower offset within a second of
the takeover, beside the frozen holder's run of the higher offset, which was still inside
its visibility timeout: two runs of one ordered partition at once (guarantee I5). The
next offset in order already waited. Two ``runconsumer`` processes, SIGSTOP, the test
publishing the late message in a transaction of its own; MySQL/MariaDB and PostgreSQL
(SQLite's file lock would stop the test's publisher behind the frozen holder).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.db import connection, transaction

from sqlqueue import send_message
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"
GROUP = "auditors"  # ordered=True (tests/testapp/consumers.py)
KEY = "k0"
#: the frozen holder's run: longer than the freeze, shorter than the visibility timeout
LONG_RUN = 5.0
VISIBILITY_TIMEOUT = 9.0


def runs(group: str) -> list[tuple[int, int, int, float, float | None]]:
    """(offset, attempt, pid, start, end or None) of every handler run in ``group``'s
    partition ``KEY``, by start (one monotonic clock for every process of the machine)."""
    calls = HandlerCall.objects.filter(group=group, partition_key=KEY).order_by("at")
    started = [c for c in calls if c.event == "started"]
    ended = {(c.message_offset, c.attempt, c.pid): c.at for c in calls
             if c.event == "finished"}
    return [(c.message_offset, c.attempt, c.pid, c.at,
             ended.get((c.message_offset, c.attempt, c.pid))) for c in started]


def lease_holder(group: str) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT leased_by FROM queue_partition_leases WHERE consumer_group = %s "
                       "AND topic = %s AND partition_key = %s", [group, TOPIC, KEY])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def finished(offset: int) -> bool:
    return HandlerCall.objects.filter(group=GROUP, event="finished",
                                      message_offset=offset).exists()


def test_a_takeover_starts_no_late_message_beside_the_frozen_holders_run(
        processes: list, server_database: None) -> None:
    settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": VISIBILITY_TIMEOUT}
    # Named so that the holder comes first: with two live members and one partition the
    # fair share is the holder's, which takes it back once it wakes (as in exp_f).
    holder = runconsumer("--group", GROUP, "--threads", "2", "--name", "a-holder",
                         settings=settings)
    processes.append(holder)
    warm_up = send_message(TOPIC, {}, partition_key=KEY)
    wait_for(lambda: finished(warm_up.offset), what="the holder's first message")
    taker = runconsumer("--group", GROUP, "--threads", "2", "--name", "b-taker",
                        settings=settings)
    processes.append(taker)
    wait_for(lambda: _live("b-taker"), what="the second runner's heartbeat")
    assert lease_holder(GROUP) == "a-holder"

    opened, commit = threading.Event(), threading.Event()
    late: list[int] = []

    def publish_late() -> None:
        try:
            with transaction.atomic():
                late.append(send_message(TOPIC, {"late": True}, partition_key=KEY).offset)
                opened.set()
                commit.wait(60)
        finally:
            connection.close()

    publisher = threading.Thread(target=publish_late)
    publisher.start()
    try:
        assert opened.wait(10)
        long = send_message(TOPIC, {"sleep": LONG_RUN}, partition_key=KEY)
        wait_for(lambda: HandlerCall.objects.filter(
            group=GROUP, event="started", message_offset=long.offset).exists(),
            what="the long run to start")
        os.kill(holder.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_for(lambda: time.monotonic() - frozen_at >= 1.0, timeout=5)
        commit.set()  # the lower offset commits late, during the freeze
        publisher.join(30)
        following = send_message(TOPIC, {}, partition_key=KEY)
        # The lease runs out; the other runner takes the partition. Frozen a little
        # longer: before the fix the late message started within a second of that.
        wait_for(lambda: lease_holder(GROUP) == "b-taker", timeout=15,
                 what="the takeover", interval=0.1)
        taken_at = time.monotonic()
        wait_for(lambda: time.monotonic() - taken_at >= 1.5, timeout=5)
    finally:
        commit.set()
        os.kill(holder.pid, signal.SIGCONT)
        publisher.join(30)

    wait_for(lambda: finished(following.offset) and finished(late[0]), timeout=60,
             what="every message to be handled")
    history = runs(GROUP)
    for i, (offset, attempt, _, start, end) in enumerate(history):
        assert end is not None, f"run of {offset} (attempt {attempt}) never finished"
        for other, other_attempt, _, other_start, other_end in history[i + 1:]:
            assert other_end is not None
            assert other_start >= end, (
                f"two runs of one ordered partition at once: {offset} (attempt {attempt}, "
                f"{start:.2f}-{end:.2f}) and {other} (attempt {other_attempt}, "
                f"{other_start:.2f}-{other_end:.2f})")
    assert {late[0], long.offset, following.offset} <= {run[0] for run in history}
    assert holder.poll() is None and taker.poll() is None


def _live(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM queue_subscriber_heartbeats "
                       "WHERE subscriber_name = %s", [name])
        return bool(cursor.fetchone()[0])
