"""``manage.py runconsumer`` as a real subprocess, with real signals."""

from __future__ import annotations

import signal
import subprocess

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import DeliveryState
from tests.acceptance.processes import runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def finished(group: str) -> list[int]:
    return sorted(HandlerCall.objects.filter(group=group, event="finished")
                  .values_list("message_offset", flat=True))


def test_until_empty_handles_everything_and_exits_zero(processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"k{n % 4}")
                                 for n in range(20)])
    process = runconsumer("--until-empty", "--threads", "3")
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    offsets = sorted(s.offset for s in sent)
    assert finished("workers") == offsets
    assert finished("auditors") == offsets
    assert "workers:accept.work: 20 acked, 0 retried, 0 dead-lettered" in out
    # The start-up banner (SPEC §10): what it serves, the database, the wake-up channel.
    banner = out.split("  consumers (")[0]
    assert banner.startswith("django-sqlqueue "), out
    assert "3 handler thread(s)" in banner
    assert "    group 'workers' on topic 'accept.work'" in out
    assert "    group 'auditors' on topic 'accept.work'" in out
    assert "  database: 'default' (" in banner
    assert "  wake-ups: publishes of this process" in banner
    # The ordered group handled each partition in offset order.
    for key in ("k0", "k1", "k2", "k3"):
        calls = list(HandlerCall.objects.filter(group="auditors", partition_key=key,
                                                event="started")
                     .order_by("id").values_list("message_offset", flat=True))
        assert calls == sorted(calls)


def test_retries_and_dead_letters_across_the_process(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({"fail_times": 1}, partition_key="k"),
                          OutgoingMessage({"reject": True}, partition_key="k")])
    process = runconsumer("--group", "workers", "--until-empty")
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "1 acked, 1 retried, 1 dead-lettered" in out


def test_an_error_quoting_a_nul_from_the_payload_does_not_hold_the_partition(
        processes: list) -> None:
    """I15 (issue 36): the audit's reproduction as a real process. The handler's error
    quotes the payload's NUL (PostgreSQL text cannot hold one): the ordered partition's
    next message is still handled, the message is dead-lettered with its real error
    after max_attempts, and the runner never reconnects."""
    from sqlqueue.models import QueueMessage

    sent = send_messages(TOPIC, [OutgoingMessage({"unknown_sku": "A\x00B"}, partition_key="k"),
                                 OutgoingMessage({"n": 1}, partition_key="k")])
    process = runconsumer("--group", "auditors", "--until-empty",
                          settings={"MAX_ATTEMPTS": 2, "MIN_BACKOFF": 0.05, "MAX_BACKOFF": 0.1,
                                    "POLL_INTERVAL": 0.05})
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "Database error" not in err and "reconnecting" not in err
    assert finished("auditors") == [sent[1].offset]
    assert "1 acked, 1 retried, 1 dead-lettered" in out
    dead = QueueMessage.objects.get(topic=TOPIC + "_dlq")
    assert "ValueError: unknown sku A\ufffdB" in dead.last_error
    assert dead.failure_detail["reason"] == "max_attempts"


def test_unknown_group_or_topic_is_a_clear_error(processes: list) -> None:
    process = runconsumer("--group", "nope", "--topic", "nothing.here")
    processes.append(process)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "no consumer in group(s) nope" in err
    assert "no consumer of topic(s) nothing.here" in err
    assert "workers:accept.work" in err  # what is registered


def test_first_signal_finishes_in_flight_work_and_gives_back_the_rest(processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"sleep": 0.5}, partition_key="k")
                                 for _ in range(10)])
    process = runconsumer("--group", "workers", "--threads", "2")
    processes.append(process)
    wait_for(lambda: HandlerCall.objects.filter(event="started").count() >= 2,
             what="two handlers to start")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    started = set(HandlerCall.objects.filter(event="started")
                  .values_list("message_offset", flat=True))
    # Every handler that started also finished: the signal let them complete.
    assert set(finished("workers")) == started
    assert len(started) < 10
    # Messages that were fetched but never started were given back: no attempt charged.
    charged = DeliveryState.objects.filter(consumer_group="workers", acked=False)
    assert not charged.filter(retry_count__gt=0).exists()
    assert not charged.filter(invisible_until__gt=0).exists()

    again = runconsumer("--group", "workers", "--until-empty", "--threads", "4")
    processes.append(again)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert finished("workers") == sorted(s.offset for s in sent)
    assert set(HandlerCall.objects.values_list("attempt", flat=True)) == {1}


def test_second_signal_exits_at_once(processes: list) -> None:
    # The handler sleeps an hour and the first signal's drain would wait for it an hour
    # (SHUTDOWN_TIMEOUT): only the second signal explains an exit within the test's wait.
    send_messages(TOPIC, [OutgoingMessage({"sleep": 3600}, partition_key="k")])
    process = runconsumer("--group", "workers", "--threads", "1",
                          settings={"SHUTDOWN_TIMEOUT": 3600})
    processes.append(process)
    wait_for(lambda: HandlerCall.objects.filter(event="started").exists(),
             what="the handler to start")
    process.send_signal(signal.SIGTERM)
    assert process.stderr is not None
    line = process.stderr.readline()  # the runner says it got the first signal
    assert "finishing in-flight handlers" in line
    process.send_signal(signal.SIGTERM)
    try:  # the handler sleeps an hour: an exit that waited for it fails here
        process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the second signal did not exit at once") from None
    assert process.returncode != 0
