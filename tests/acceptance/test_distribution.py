"""Many ``runconsumer`` processes sharing a group: leases, fair share, and faults
(SIGKILL, SIGSTOP, clock skew), with real subprocesses and real signals."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import PartitionLease, QueueMessage, SubscriberHeartbeat
from sqlqueue.storage.sql import store_for
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def shares(group: str = "workers") -> list[int]:
    """Partitions held per live subscriber, largest first."""
    counts = Counter(PartitionLease.objects.filter(consumer_group=group, topic=TOPIC)
                     .values_list("leased_by", flat=True))
    return sorted(counts.values(), reverse=True)


def live(group: str = "workers") -> int:
    return SubscriberHeartbeat.objects.filter(consumer_group=group, topic=TOPIC).count()


def publish(partitions: int, per_partition: int = 1, **payload: object) -> list[int]:
    sent = send_messages(TOPIC, [
        OutgoingMessage(dict(payload), partition_key=f"p{n % partitions:04d}")
        for n in range(partitions * per_partition)
    ])
    return [s.offset for s in sent]


#: leases renewed once an hour: a handover a test sees within its timeout did not wait for one
HOUR_LEASES = {"LEASE_DURATION": 3 * 3600, "LEASE_RENEW_INTERVAL": 3600, "POLL_INTERVAL": 0.05}


def test_three_subscribers_share_twelve_partitions_then_two(processes: list) -> None:
    publish(12)
    settings = FAST_LEASES
    for n in range(3):
        processes.append(runconsumer("--group", "workers", "--name", f"s{n}",
                                     settings=settings))
    wait_for(lambda: live() == 3, what="three subscribers to heartbeat")
    # The fair split, not its speed: the timeouts only end a hang (how long a split takes
    # is measured by bench/lease_split.py).
    wait_for(lambda: shares() == [4, 4, 4], timeout=60, what="a 4/4/4 split")
    processes[0].send_signal(signal.SIGTERM)  # a graceful leave
    assert processes[0].wait(30) == 0
    wait_for(lambda: shares() == [6, 6], timeout=60, what="a 6/6 split after the leave")


def test_a_busy_subscriber_takes_over_a_graceful_leave_before_its_renewal(
        processes: list) -> None:
    """Leases renewed only once an hour: the partitions a subscriber hands
    over when it stops are picked up by a busy peer, not at the peer's
    next renewal (its fence sees them free)."""
    publish(8, per_partition=60, sleep=0.05)  # enough work to keep both busy throughout
    settings = HOUR_LEASES
    leaver = runconsumer("--group", "workers", "--name", "a-leaver", "--threads", "2",
                         settings=settings)
    stayer = runconsumer("--group", "workers", "--name", "b-stayer", "--threads", "2",
                         settings=settings)
    processes += [leaver, stayer]
    wait_for(lambda: shares() == [4, 4], timeout=40, what="4/4")
    leaver.send_signal(signal.SIGTERM)
    assert leaver.wait(30) == 0
    # Its renewal is an hour away: only the fence seeing the partitions free explains a
    # takeover within the (hang-only) timeout.
    wait_for(lambda: shares() == [8], timeout=60,
             what="the stayer to take the leaver's 4 before its renewal")


def test_a_busy_holder_hands_a_newcomer_its_share_before_its_renewal(
        processes: list) -> None:
    """Leases renewed only once an hour: a subscriber that joins gets its
    share from a busy holder, not at the holder's next renewal (a busy
    subscriber looks at the membership once a second)."""
    publish(8, per_partition=80, sleep=0.05)
    settings = HOUR_LEASES
    holder = runconsumer("--group", "workers", "--name", "a-holder", "--threads", "2",
                         settings=settings)
    processes.append(holder)
    wait_for(lambda: shares() == [8], timeout=30, what="the holder to hold all 8")
    wait_for(lambda: HandlerCall.objects.filter(pid=holder.pid, event="finished").count() >= 3,
             what="the holder to be busy")
    newcomer = runconsumer("--group", "workers", "--name", "b-newcomer", "--threads", "2",
                           settings=settings)
    processes.append(newcomer)
    wait_for(lambda: live() == 2, timeout=30, what="the newcomer's first heartbeat")
    # The holder's renewal is an hour away: only its look at the membership explains the
    # handover within the (hang-only) timeout.
    wait_for(lambda: shares() == [4, 4], timeout=60,
             what="the busy holder to hand the newcomer 4 before its renewal")


def test_an_until_empty_newcomer_drains_its_share_of_a_busy_holders_partitions(
        processes: list) -> None:
    """A worker started with ``--until-empty`` beside a busy member that holds every
    partition waits for its share, takes it and drains it: it is not done while the
    partitions that are to be its own are still another's. (It found every partition
    held by a live member and exited at once, leaving the whole drain to the first
    process: two processes drained more slowly than one.)"""
    publish(8, per_partition=80, sleep=0.05)
    settings = {"LEASE_DURATION": 30, "LEASE_RENEW_INTERVAL": 10, "POLL_INTERVAL": 0.05}
    holder = runconsumer("--group", "workers", "--name", "a-holder", "--threads", "2",
                         settings=settings)
    processes.append(holder)
    wait_for(lambda: shares() == [8], timeout=30, what="the holder to hold all 8")
    wait_for(lambda: HandlerCall.objects.filter(pid=holder.pid, event="finished").count() >= 3,
             what="the holder to be busy")
    newcomer = runconsumer("--group", "workers", "--name", "b-newcomer", "--threads", "2",
                           "--until-empty", settings=settings)
    processes.append(newcomer)
    assert newcomer.wait(120) == 0
    handled = HandlerCall.objects.filter(pid=newcomer.pid, event="finished").count()
    assert handled >= 40, handled  # about half the 640 messages, not none


def test_an_idle_until_empty_worker_takes_over_a_leaving_members_partitions_at_once(
        processes: list) -> None:
    """Leases renewed only once an hour. An ``--until-empty`` worker shares a group with a
    member (played by the test) that holds 4 of 16 partitions: the worker takes its share,
    8, and drains them; 4 partitions nobody holds are left, so it is not done. Idle, it
    waits for them. When the member leaves (releases its leases and deregisters, as
    ``runconsumer`` does on SIGTERM), the worker takes the 12 within seconds, drains
    them, and exits: not at its renewal an hour away. (An idle worker looked at the
    membership only at its renewal: two ``--until-empty`` workers draining 20,000
    messages took 12 s, not 2, when one left between the other's ticks.)"""
    settings = HOUR_LEASES
    offsets = publish(16, per_partition=2)
    member = {"consumer_group": "workers", "topic": TOPIC}
    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
    SubscriberHeartbeat.objects.create(**member, subscriber_name="a-member", heartbeat_at=now)
    for n in range(4):
        PartitionLease.objects.create(**member, partition_key=f"p{n:04d}", leased_by="a-member",
                                      leased_at=now, lease_renewed_at=now, generation=1)
    worker = runconsumer("--group", "workers", "--name", "b-worker", "--until-empty",
                         settings=settings)
    processes.append(worker)
    wait_for(lambda: shares() == [8, 4], timeout=30, what="the worker to take its share")
    mine = set(PartitionLease.objects.filter(leased_by="b-worker")
               .values_list("partition_key", flat=True))
    wait_for(lambda: {offsets[n] for n in range(32) if f"p{n % 16:04d}" in mine}
             <= set(finished_offsets("workers")), what="the worker to drain its 8")
    assert worker.poll() is None  # 4 partitions nobody holds: not done
    PartitionLease.objects.filter(leased_by="a-member").delete()
    SubscriberHeartbeat.objects.filter(subscriber_name="a-member").delete()
    # Its renewal is an hour away: the (hang-only) timeout fails a worker that waits for it.
    try:
        assert worker.wait(60) == 0
    except subprocess.TimeoutExpired:
        raise AssertionError("the idle worker did not take over the leaver's partitions "
                             "before its renewal") from None
    finished = Counter(finished_offsets("workers"))
    assert set(finished) == set(offsets)
    assert max(finished.values()) == 1


def test_a_killed_subscriber_loses_nothing(processes: list) -> None:
    offsets = publish(6, per_partition=10, sleep=0.05)
    # 10 s: the victim's messages come back within the test's minute, and a survivor whose
    # own ack waits a few seconds on a loaded machine (CI: load 10 on 2 cores) does not see
    # its visibility timeout pass and deliver a message again (at-least-once, but not what
    # this test counts).
    settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": 10}
    victim = runconsumer("--group", "workers", "--name", "victim", "--threads", "2",
                         settings=settings)
    survivor = runconsumer("--group", "workers", "--name", "survivor", "--threads", "2",
                           settings=settings)
    processes += [victim, survivor]
    wait_for(lambda: HandlerCall.objects.filter(pid=victim.pid, event="finished").count() >= 3,
             what="the victim to handle a few messages")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_for(lambda: set(finished_offsets("workers")) >= set(offsets), timeout=60,
             what="every message to be handled")
    started = Counter(HandlerCall.objects.filter(group="workers", event="started")
                      .values_list("message_offset", flat=True))
    duplicated = {offset for offset, n in started.items() if n > 1}
    # Only what the victim had in hand when it died was handled twice.
    victim_done = set(HandlerCall.objects.filter(pid=victim.pid, event="finished")
                      .values_list("message_offset", flat=True))
    victim_started = set(HandlerCall.objects.filter(pid=victim.pid, event="started")
                         .values_list("message_offset", flat=True))
    assert duplicated <= (victim_started - victim_done) | victim_done
    assert len(duplicated) <= 2 + 6 * 10  # bounded by what it had taken
    assert len(duplicated - (victim_started - victim_done)) <= 3  # acked but not yet recorded


def finished_offsets(group: str) -> list[int]:
    return list(HandlerCall.objects.filter(group=group, event="finished")
                .values_list("message_offset", flat=True))


def test_a_paused_subscriber_starts_nothing_on_lost_partitions(processes: list) -> None:
    """SIGSTOP past the lease duration, then SIGCONT: the paused one has lost its
    partitions and starts no handler there; an ordered partition never runs two at once.

    With one handler thread, the paused subscriber has deliveries queued for three of its
    four partitions when it stops: after it resumes they must not start. It is then
    asked to stop, so that it does not win partitions back in a fair-share rebalance.
    """
    if connection.vendor == "sqlite":
        pytest.skip("a process stopped while it holds SQLite's file lock stops every writer "
                    "until it resumes: SQLite is for one machine and few processes")
    offsets = publish(4, per_partition=6, sleep=0.2)
    settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": 6}
    paused = runconsumer("--group", "auditors", "--name", "paused", "--threads", "1",
                         settings=settings)
    processes.append(paused)
    wait_for(lambda: HandlerCall.objects.filter(pid=paused.pid, event="started").exists(),
             what="the first handler")
    paused.send_signal(signal.SIGSTOP)
    other = runconsumer("--group", "auditors", "--name", "other", "--threads", "4",
                        settings=settings)
    processes.append(other)
    wait_for(lambda: shares("auditors") == [4], timeout=30,
             what="the other subscriber to take every partition")
    resumed_at = time.monotonic()
    paused.send_signal(signal.SIGCONT)
    paused.send_signal(signal.SIGTERM)
    assert paused.wait(30) == 0
    wait_for(lambda: set(finished_offsets("auditors")) >= set(offsets), timeout=90,
             what="every message to be handled")
    late_starts = HandlerCall.objects.filter(pid=paused.pid, event="started",
                                             at__gte=resumed_at)
    assert not late_starts.exists(), list(late_starts.values())
    assert_no_overlap("auditors")


def assert_no_overlap(group: str) -> None:
    """Within each partition, handler runs never overlap (ordered consumers)."""
    runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    open_runs: dict[tuple[int, int, int], float] = {}
    for call in HandlerCall.objects.filter(group=group).order_by("at"):
        key = (call.pid, call.message_offset, call.attempt)
        if call.event == "started":
            open_runs[key] = call.at
        elif key in open_runs:
            runs[call.partition_key].append((open_runs.pop(key), call.at, call.message_offset))
    for partition, spans in runs.items():
        spans.sort()
        for (_, end, offset), (start, _, next_offset) in itertools.pairwise(spans):
            assert start >= end, f"{partition}: {offset} and {next_offset} overlapped"


FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.mark.skipif(not os.path.exists(FAKETIME), reason="Debian's faketime is not installed")
def test_a_skewed_clock_neither_steals_nor_redelivers_early(processes: list) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite is embedded: its clock is each process's own, so a skewed "
                    "process skews its database time too (SQLite is single-machine)")
    offsets = publish(4, per_partition=2)
    scheduled = send_messages(TOPIC, [OutgoingMessage({}, partition_key="p0000", delay=4)])
    honest = runconsumer("--group", "workers", "--name", "honest", settings=FAST_LEASES)
    processes.append(honest)
    wait_for(lambda: shares() == [4], what="the honest subscriber to hold everything")
    skewed = runconsumer(
        "--group", "workers", "--name", "skewed", settings=FAST_LEASES,
        # The wall clock is an hour ahead; the monotonic clock, which a skewed system
        # clock does not move either, is left alone.
        env={"LD_PRELOAD": FAKETIME, "FAKETIME": "+1h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
    )
    processes.append(skewed)
    wait_for(lambda: shares() == [2, 2], timeout=20, what="a 2/2 split")
    wait_for(lambda: set(finished_offsets("workers")) >= set(offsets) | {scheduled[0].offset},
             timeout=30, what="every message")
    # Handovers were releases, never takeovers of a live lease (those bump generation).
    assert set(PartitionLease.objects.exclude(consumer_group="")  # (the server record)
               .values_list("generation", flat=True)) == {1}
    # The scheduled message started no earlier than it was due, by the database clock.
    due = QueueMessage.objects.get(offset=scheduled[0].offset).deliver_after
    started = HandlerCall.objects.get(message_offset=scheduled[0].offset, event="started")
    assert started.attempt == 1
    assert database_ms_at(started) >= due


def database_ms_at(call: HandlerCall) -> int:
    """The database time of a journal row (its id order follows the database clock)."""
    with connection.cursor() as cursor:
        from sqlqueue.storage.sql import store_for

        now = store_for(connection).database_now_ms(cursor)
    return now - round((time.monotonic() - call.at) * 1000)


def test_a_thousand_partitions_ten_subscribers(processes: list) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("ten processes writing one SQLite file queue on its single write lock; "
                    "SQLite is for one machine and few processes (docs/guides/operations.md)")
    publish(1000)
    settings = {**FAST_LEASES, "LEASE_DURATION": 8, "LEASE_RENEW_INTERVAL": 2}
    for n in range(10):
        processes.append(runconsumer("--group", "workers", "--name", f"s{n:02d}",
                                     "--threads", "1", settings=settings))
    wait_for(lambda: live() == 10, timeout=60, what="ten subscribers")
    # The fair split, not its speed: the timeout only ends a hang. How long the split takes
    # (PostgreSQL's FOR SHARE fence writes a lock mark into each of a subscriber's 100 lease
    # rows on every pass, which slows it; issue 20) is measured by bench/lease_split.py,
    # not asserted here: it failed this test on a loaded machine (load 8+).
    wait_for(lambda: shares() == [100] * 10, timeout=180, what="a 100-each split")
