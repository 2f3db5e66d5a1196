"""``runconsumer --processes N``: the supervisor, with real processes and signals (#17)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlqueue import OutgoingMessage, send_messages
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.integration.consuming_helpers import reached, watermarks
from tests.testapp.models import HandlerCall

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                 reason="finds the workers through /proc")]
TOPIC = "accept.work"
FAST = {**FAST_LEASES, "SHUTDOWN_TIMEOUT": 10}
#: For the exactly-once of graceful recycling: a recycled worker hands its partitions over
#: on its way out, so the lease's length does not slow the test, while a 2 s lease can run
#: out under a live worker on a starved machine (a loaded CI host), and a lost lease's
#: fenced acks are redelivered: the at-least-once of a lost lease, which the history
#: tests check, not what this test is about.
RECYCLING = {**FAST, "LEASE_DURATION": 10}


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...


def workers_of(pid: int) -> set[int]:
    """The live children of process ``pid``."""
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[1] == str(pid) and fields[0] != "Z":
                children.add(int(entry.name))
    return children


def running(pid: int) -> bool:
    """Alive, and not a zombie (an orphan's exit is reaped by whoever adopted it)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


@pytest.fixture
def supervised() -> Iterator[list[subprocess.Popen[str]]]:
    """Supervisors a test starts: stopped gracefully at the end, workers included, so
    that none of them is still writing when the next test starts."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        children = workers_of(process.pid)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        wait_for(lambda pids=children: not any(running(pid) for pid in pids),  # type: ignore[misc]
                 timeout=30, what="the workers to exit")
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def supervisor(*args: str, settings: dict[str, object] = FAST) -> subprocess.Popen[str]:
    # stdout and stderr to files would do too; pipes are read at the end (small logs).
    return runconsumer("--group", "workers", *args, settings=settings)


def finished_offsets() -> Counter[int]:
    return Counter(HandlerCall.objects.filter(group="workers", event="finished")
                   .values_list("message_offset", flat=True))


def last_offsets(sent: list) -> dict[str, int]:
    last: dict[str, int] = {}
    for message in sent:
        last[message.partition_key] = max(last.get(message.partition_key, 0), message.offset)
    return last


def test_a_killed_worker_is_replaced(supervised: list) -> None:
    process = supervisor("--processes", "2", "--threads", "2")
    supervised.append(process)
    first = wait_for_workers(process, 2)
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(workers_of(process.pid)) == 2 and victim not in
             workers_of(process.pid), timeout=20, what="a new worker in its place")
    # The new worker works: messages published now are all handled.
    sent = send_messages(TOPIC, [OutgoingMessage({}, partition_key=f"k{n % 4}")
                                 for n in range(20)])
    wait_for(lambda: reached("workers", last_offsets(sent)), timeout=60,
             what="every message acked")
    assert process.poll() is None


def wait_for_workers(process: subprocess.Popen[str], count: int) -> set[int]:
    wait_for(lambda: len(workers_of(process.pid)) == count, timeout=20,
             what=f"{count} workers")
    return workers_of(process.pid)


@pytest.mark.parametrize(("messages", "processes"), [
    (500, 2), pytest.param(3000, 3, marks=pytest.mark.soak)])
def test_recycling_by_message_count_loses_nothing(messages: int, processes: int,
                                                  supervised: list) -> None:
    """Each worker handles 50 messages and is replaced: every message is handled exactly
    once and acked (the group's watermarks reach the head) over 10 (60) recycles."""
    sent = send_messages(TOPIC, [OutgoingMessage({}, partition_key=f"k{n % 8}")
                                 for n in range(messages)])
    process = supervisor("--processes", str(processes), "--threads", "4",
                         "--max-messages-per-child", "50", settings=RECYCLING)
    supervised.append(process)
    try:
        wait_for(lambda: reached("workers", last_offsets(sent)), timeout=messages // 2,
                 what="every message acked")
    except AssertionError:
        raise AssertionError(not_acked(sent, process)) from None
    counts = finished_offsets()
    missing = sorted({m.offset for m in sent} - set(counts))
    assert missing == [], f"never handled: {missing}"
    twice = {offset: n for offset, n in counts.items() if n > 1}
    assert twice == {}, f"handled more than once: {twice}{workers_log(process)}"
    pids = set(HandlerCall.objects.filter(group="workers").values_list("pid", flat=True))
    assert len(pids) >= messages // 50, f"only {len(pids)} worker processes"
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


def not_acked(sent: list, process: subprocess.Popen[str]) -> str:
    """What is left, to tell a slow drain from a lost message."""
    from sqlqueue.models import DeliveryState, PartitionLease

    counts = finished_offsets()
    missing = sorted({m.offset for m in sent} - set(counts))
    states = list(DeliveryState.objects.filter(consumer_group="workers", message_offset__in=missing)
                  .values_list("message_offset", "acked", "retry_count", "invisible_until"))
    leases = list(PartitionLease.objects.filter(consumer_group="workers")
                  .values_list("partition_key", "leased_by", "lease_renewed_at"))
    report = (f"not handled: {missing[:20]} ({len(missing)}); their states: {states[:20]}; "
              f"watermarks {watermarks('workers')} vs {last_offsets(sent)}; leases {leases}; "
              f"workers {workers_of(process.pid)}")
    return report + workers_log(process)


def workers_log(process: subprocess.Popen[str]) -> str:
    """With SQLQUEUE_TEST_LOG=1, the workers' warnings (the supervisor is stopped)."""
    if not os.environ.get("SQLQUEUE_TEST_LOG"):
        return ""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    words = ("lost", "abandon", "gave up", "outlived", "Database error", "Could not")
    return "\n" + "\n".join(line for line in err.splitlines()
                             if any(word in line for word in words))


def test_a_worker_with_a_stuck_handler_is_replaced(supervised: list) -> None:
    """timeout=1 and --stuck-grace 1: the retry runs at once on a fresh thread, and the
    process, its first handler still stuck, is replaced a second later."""
    send_messages("accept.stuck", [OutgoingMessage({}, partition_key="k")])
    process = runconsumer("--group", "stuck", "--processes", "1", "--stuck-grace", "1",
                          settings={**FAST, "MIN_BACKOFF": 0.1, "MAX_BACKOFF": 0.2})
    supervised.append(process)
    (first,) = wait_for_workers(process, 1)
    wait_for(lambda: HandlerCall.objects.filter(group="stuck", event="finished").exists(),
             timeout=30, what="the retry")
    wait_for(lambda: len(workers_of(process.pid) - {first}) == 1 and not running(first),
             timeout=30, what="a new worker in place of the stuck one")
    assert list(HandlerCall.objects.filter(group="stuck", event="finished")
                .values_list("attempt", flat=True)) == [2]


def test_a_worker_past_max_memory_is_recycled(supervised: list) -> None:
    process = supervisor("--processes", "1", "--max-memory", "1")  # every worker is bigger
    supervised.append(process)
    seen: set[int] = set()

    def three_workers_seen() -> bool:
        seen.update(workers_of(process.pid))
        return len(seen) >= 3

    wait_for(three_workers_seen, timeout=60, what="workers recycled for their memory")
    assert process.poll() is None


def test_sigterm_drains_the_workers_and_exits_0(supervised: list, processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"sleep": 0.5}, partition_key=f"k{n % 4}")
                                 for n in range(40)])
    process = supervisor("--processes", "2", "--threads", "2")
    supervised.append(process)
    children = wait_for_workers(process, 2)
    wait_for(lambda: HandlerCall.objects.filter(event="started").count() >= 4,
             what="handlers running")
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert not any(running(pid) for pid in children)
    # Every handler that started finished (drained), and nothing was left marked
    # delivered: what did not start is delivered again at once to the next consumer.
    started = HandlerCall.objects.filter(event="started").count()
    assert HandlerCall.objects.filter(event="finished").count() == started < len(sent)
    again = runconsumer("--group", "workers", "--until-empty", "--threads", "4",
                        settings=FAST)
    processes.append(again)
    assert again.wait(60) == 0
    assert reached("workers", last_offsets(sent))
    assert set(finished_offsets()) == {m.offset for m in sent}


def test_sigkill_of_the_supervisor_leaves_no_worker_running(supervised: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({"sleep": 0.2}, partition_key=f"k{n % 4}")
                          for n in range(40)])
    process = supervisor("--processes", "3", "--threads", "2")
    supervised.append(process)
    children = wait_for_workers(process, 3)
    wait_for(lambda: HandlerCall.objects.filter(event="started").count() >= 2,
             what="handlers running")
    process.kill()
    process.wait(10)
    wait_for(lambda: not any(running(pid) for pid in children), timeout=30,
             what="every worker to stop after its supervisor died")
