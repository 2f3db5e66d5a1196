"""``async def`` handlers in a real ``runconsumer`` (issue 13): each is awaited, so its
side effect happens for every message; with ``atomic=True`` its async ORM writes commit
with the ack, or roll back with a failed attempt."""

from __future__ import annotations

import pytest

from sqlqueue import OutgoingMessage, send_messages
from tests.acceptance.processes import FAST_LEASES, runconsumer
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.async"


def journal(group: str, event: str) -> list[int]:
    return sorted(HandlerCall.objects.filter(group=group, event=event)
                  .values_list("message_offset", flat=True))


def test_async_handler_runs_for_every_message(processes: list) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"k{n % 3}")
                                 for n in range(12)])
    process = runconsumer("--group", "asyncworkers", "--until-empty", "--threads", "3")
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "never awaited" not in err
    assert journal("asyncworkers", "finished") == sorted(s.offset for s in sent)
    assert "asyncworkers:accept.async: 12 acked, 0 retried, 0 dead-lettered" in out


def test_atomic_async_handler_commits_with_the_ack_and_rolls_back_a_failure(
    processes: list,
) -> None:
    sent = send_messages(TOPIC, [OutgoingMessage({"fail_times": 1}, partition_key="a"),
                                 OutgoingMessage({}, partition_key="b")])
    process = runconsumer("--group", "asyncatomic", "--until-empty",
                          settings={**FAST_LEASES, "MIN_BACKOFF": 0, "MAX_BACKOFF": 0.1})
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    offsets = sorted(s.offset for s in sent)
    assert journal("asyncatomic", "finished") == offsets
    # The failed first attempt's "started" row was rolled back with its transaction:
    # one "started" per message, each from the attempt that committed.
    assert journal("asyncatomic", "started") == offsets
    started = HandlerCall.objects.filter(group="asyncatomic", event="started")
    assert {(c.message_offset, c.attempt) for c in started} == {
        (sent[0].offset, 2), (sent[1].offset, 1)}
    assert "asyncatomic:accept.async: 2 acked, 1 retried, 0 dead-lettered" in out
