"""``manage.py queue``: status and lag, dead letters, garbage collection."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError

import sqlqueue
from sqlqueue import Message, OutgoingMessage, send_message, send_messages
from sqlqueue.models import CollectionRun, QueueMessage
from sqlqueue.operations.lag import group_lag
from tests.integration.consuming_helpers import (
    drain,
    drain_until_watermarks,
    fast_settings,
    queue,
    register,
)

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def reject(message: Message) -> None:
    raise sqlqueue.Reject(f"cannot handle {message.payload}")


def test_status_reports_lag_per_group(register: Any) -> None:
    register("orders", "billing", lambda m: None)
    register("orders", "shipping", reject)
    sent = send_messages("orders", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    drain_until_watermarks("billing", {"k": sent[-1].offset})
    drain(["shipping"])
    billing = group_lag("billing", "orders")
    assert (billing.status, billing.pending, billing.dead_letters) == ("OK", 0, 0)
    shipping = group_lag("shipping", "orders")
    assert shipping.dead_letters == 3 and shipping.status == "WARN"
    out = queue("status", "--partitions")
    assert "billing" in out and "shipping" in out and "WARN" in out


def test_status_says_stop_when_nobody_holds_pending_work(register: Any) -> None:
    register("orders", "billing", lambda m: None)
    send_message("orders", 1, partition_key="k")
    drain(["billing"])  # registers the group; its leases are released when it stops
    send_message("orders", 2, partition_key="k")
    lag = group_lag("billing", "orders")
    assert lag.pending >= 1 and lag.status == "STOP"


def test_dead_letters_list_replay_and_discard(register: Any) -> None:
    register("t", "g", reject)
    send_messages("t", [OutgoingMessage(n, partition_key="k", id=f"m{n}") for n in range(3)])
    drain(["g"])
    listing = queue("dead-letters", "list", "--group", "g")
    header, *lines = listing.splitlines()
    assert header.split() == ["offset", "group", "topic/partition", "id", "attempts", "last",
                              "error"]
    assert len(lines) == 3 and all(line.split()[1:5:3] == ["g", "1"] for line in lines)
    assert "cannot handle" in listing
    # Each column starts where its header does.
    assert lines[0].index(" g ") + 1 == header.index("group")
    first, second, _third = QueueMessage.objects.filter(topic="t_dlq").order_by("offset")
    assert "Replayed 1" in queue("dead-letters", "replay", str(first.offset))
    with pytest.raises(CommandError, match="add --yes"):
        queue("dead-letters", "discard", "--all", "--group", "g")
    assert "Discarded 2" in queue("dead-letters", "discard", "--all", "--group", "g", "--yes")
    with pytest.raises(CommandError, match=f"No dead letter at offset.*{second.offset}"):
        queue("dead-letters", "replay", str(second.offset))
    assert not QueueMessage.objects.filter(topic="t_dlq").exists()
    assert QueueMessage.objects.filter(topic="t", consumer_group="g").count() == 1  # replayed


def test_gc_command(register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(5)])
    drain_until_watermarks("g", {"k": sent[-1].offset}, conf=fast_settings(RETENTION=3600))
    assert "Deleted 5 message(s)" in queue("gc")
    assert not QueueMessage.objects.filter(topic="t").exists()
    # The run is written down for the admin's live overview: who, how far, when.
    (run,) = CollectionRun.objects.filter(collector__startswith="queue gc on ")
    assert run.messages == 5 and run.finished_at >= run.started_at > 0


def test_gc_share_pauses_between_batches(register: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``queue gc --share 0.25`` deletes everything, pausing after each batch three
    times as long as it took (live traffic keeps the database the rest of the time): the
    operation it runs, on a clock given to it (not patched into the module)."""
    from sqlqueue.consuming import gc
    from sqlqueue.operations.gc import collect_garbage

    class BatchClock:
        """Each batch "takes" 2 s of this clock; its pauses are written down."""

        def __init__(self) -> None:
            self.readings = iter(range(0, 1000, 2))
            self.pauses: list[float] = []

        def monotonic(self) -> float:
            return float(next(self.readings))

        def wall(self) -> float:
            return 0.0

        def sleep(self, seconds: float) -> None:
            self.pauses.append(seconds)

    register("t", "g", lambda m: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(30)])
    drain_until_watermarks("g", {"k": sent[-1].offset}, conf=fast_settings(RETENTION=3600))
    monkeypatch.setattr(gc, "GC_SWEEP_WINDOW", 10)  # three batches
    clock = BatchClock()
    assert collect_garbage(share=0.25, host_clock=clock).messages == 30
    assert clock.pauses == [6.0, 6.0, 6.0]
    assert not QueueMessage.objects.filter(topic="t").exists()
    with pytest.raises(CommandError, match="at most 1"):
        queue("gc", "--share", "2")


def test_gc_share_from_the_command_line(register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    drain_until_watermarks("g", {"k": sent[-1].offset}, conf=fast_settings(RETENTION=3600))
    assert "Deleted 3 message(s)" in queue("gc", "--share", "0.5")
    assert not QueueMessage.objects.filter(topic="t").exists()


def test_retry_now_and_reset_position_from_the_command_line(register: Any) -> None:
    attempts: list[int] = []

    def flaky(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt == 1:
            raise sqlqueue.Retry(delay=3600)

    register("orders", "billing", flaky)
    sent = send_message("orders", 1, partition_key="k")
    drain(["billing"], max_messages=1)
    assert queue("retry-now", "billing", "orders") == \
        "1 message(s) will be delivered again now.\n"
    keep = fast_settings(RETENTION=3600)  # keep the finished message: it is rewound to
    drain(["billing"], conf=keep)
    assert attempts == [1, 2]

    with pytest.raises(CommandError, match="add --yes"):
        queue("reset-position", "billing", "orders", "k", "--to-head")
    with pytest.raises(CommandError, match="is beyond partition 'k'"):
        queue("reset-position", "billing", "orders", "k", "--from", str(sent.offset + 9),
              "--yes")
    with pytest.raises(CommandError, match="No consumer group 'nope'"):
        queue("retry-now", "nope", "orders")
    out = queue("reset-position", "billing", "orders", "k", "--from", str(sent.offset),
                "--yes")
    assert f"from offset {sent.offset} on is delivered (again)" in out
    drain(["billing"], conf=keep, max_messages=1)
    assert attempts == [1, 2, 1]  # a fresh start: its attempts were reset too
