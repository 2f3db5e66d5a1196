"""Issue 42: a real ``runconsumer`` asked, by its name, to drain and stop or to stop at
once (what the admin's Subscribers page does): it obeys within one lease renew interval,
logs who asked, and hands its partitions over."""

from __future__ import annotations

import subprocess

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import RunnerRequest
from sqlqueue.operations.runners import live_runners, request_runner_stop
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def started_offsets() -> set[int]:
    return set(HandlerCall.objects.filter(event="started")
               .values_list("message_offset", flat=True))


def finished_offsets() -> set[int]:
    return set(HandlerCall.objects.filter(event="finished")
               .values_list("message_offset", flat=True))


def assert_obeyed(name: str) -> None:
    """The request was stamped obeyed. That it is read once per renew interval is
    tests/integration/test_runner_control.py's, on a clock the test moves: timed here, it
    failed on a loaded machine."""
    request = RunnerRequest.objects.get(runner_name=name)
    assert request.obeyed_at >= request.requested_at > 0, "the request was never obeyed"


def test_drain_and_stop_finishes_running_handlers_then_exits(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({"sleep": 0.5}, partition_key=f"k{n % 2}")
                          for n in range(10)])
    process = runconsumer("--group", "workers", "--threads", "2", "--name", "drain-me",
                          settings=FAST_LEASES)
    processes.append(process)
    wait_for(lambda: len(started_offsets()) >= 2, what="two handlers to start")
    assert "drain-me" in live_runners()
    request_runner_stop("drain-me", "drain", by="alice")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "drain-me: the user 'alice' asked this runner to drain and stop" in err
    assert_obeyed("drain-me")
    # Every handler that started finished; the rest was given back, not charged.
    assert finished_offsets() == started_offsets() and len(started_offsets()) < 10
    assert "drain-me" not in live_runners()  # it said goodbye: its partitions are free


def test_stop_at_once_does_not_wait_for_a_running_handler(processes: list) -> None:
    # The handler sleeps an hour, and a drain would wait for it an hour (SHUTDOWN_TIMEOUT):
    # a stop that waited for it fails the (hang-only) timeout below.
    send_messages(TOPIC, [OutgoingMessage({"sleep": 3600}, partition_key="k")])
    process = runconsumer("--group", "workers", "--threads", "1", "--name", "stop-me",
                          settings={**FAST_LEASES, "SHUTDOWN_TIMEOUT": 3600})
    processes.append(process)
    wait_for(lambda: bool(started_offsets()), what="the handler to start")
    request_runner_stop("stop-me", "stop", by="bob")
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("stopping at once waited for the running handler") from None
    assert process.returncode == 0, err
    assert "stop-me: the user 'bob' asked this runner to stop at once" in err
    assert_obeyed("stop-me")
    assert not finished_offsets()  # its message comes back after its visibility timeout
    assert "stop-me" not in live_runners()


def test_a_second_runner_under_a_live_runners_name_refuses_to_start(processes: list) -> None:
    """Audit W8: two ``runconsumer --name dup`` (of two groups) both ran, and a stop
    request reached only the one that read it first. The second now refuses to start; the
    first runs on and obeys the request."""
    first = runconsumer("--group", "workers", "--name", "dup", settings=FAST_LEASES)
    processes.append(first)
    wait_for(lambda: "dup" in live_runners(), what="the first runner's heartbeat")
    second = runconsumer("--group", "auditors", "--name", "dup", settings=FAST_LEASES)
    processes.append(second)
    _, err = second.communicate(timeout=60)
    assert second.returncode != 0
    assert "A runner named 'dup' is running" in err and "another --name" in err, err
    assert first.poll() is None  # the first runs on
    request_runner_stop("dup", "drain", by="alice")
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "dup: the user 'alice' asked this runner to drain and stop" in err
    assert live_runners() == []
