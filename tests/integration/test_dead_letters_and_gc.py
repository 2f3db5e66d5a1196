"""Replaying and discarding dead letters; garbage collection of the log."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.db import connection

import sqlqueue
from sqlqueue import Message, send_message, send_messages, storage
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.operations.dead_letters import (
    NotADeadLetter,
    discard_dead_letter,
    replay_dead_letter,
)
from sqlqueue.storage.statements.delivery import OutcomeWrite
from tests.integration.consuming_helpers import (
    drain,
    drain_until_watermarks,
    fast_settings,
    register,
)

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def test_replay_redelivers_to_that_group_only(register: Any) -> None:
    calls: dict[str, list[tuple[str, int]]] = {"billing": [], "shipping": []}
    fail = {"on": True}

    def billing(message: Message) -> None:
        calls["billing"].append((message.id, message.attempt))
        if fail["on"]:
            raise sqlqueue.Reject("card declined")

    register("orders", "billing", billing)
    register("orders", "shipping", lambda m: calls["shipping"].append((m.id, m.attempt)))
    send_message("orders", {"n": 1}, partition_key="c-1", id="o-1")
    drain(["billing", "shipping"])
    dead = QueueMessage.objects.get(topic="orders_dlq")

    fail["on"] = False
    replayed = replay_dead_letter(dead.offset)
    assert (replayed.group, replayed.topic, replayed.partition_key) == (
        "billing", "orders", "c-1")
    assert not QueueMessage.objects.filter(topic="orders_dlq").exists()
    drain(["billing", "shipping"])
    # Billing got it again, with its original id and a fresh retry budget; shipping did not.
    assert calls["billing"] == [("o-1", 1), ("o-1", 1)]
    assert calls["shipping"] == [("o-1", 1)]


def test_dead_lettering_again_after_a_replay(register: Any) -> None:
    register("t", "g", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("still broken")))
    send_message("t", 1, partition_key="k", id="x")
    drain(["g"])
    first = QueueMessage.objects.get(topic="t_dlq")
    replay_dead_letter(first.offset)
    drain(["g"])
    second = QueueMessage.objects.get(topic="t_dlq")
    assert second.offset != first.offset
    assert second.failure_detail["id"] == "x"
    replay_dead_letter(second.offset)  # and it can be replayed again
    drain(["g"])
    assert QueueMessage.objects.filter(topic="t_dlq").count() == 1


def test_replaying_twice_is_refused() -> None:
    with pytest.raises(NotADeadLetter):
        replay_dead_letter(10**9)
    plain = send_message("t", 1)
    with pytest.raises(NotADeadLetter, match="not a dead letter"):
        replay_dead_letter(plain.offset)
    with pytest.raises(NotADeadLetter):
        replay_dead_letter(-1)


def test_discard(register: Any) -> None:
    register("t", "g", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")))
    send_message("t", 1)
    drain(["g"])
    dead = QueueMessage.objects.get(topic="t_dlq")
    discard_dead_letter(dead.offset)
    assert not QueueMessage.objects.filter(topic="t_dlq").exists()
    with pytest.raises(NotADeadLetter):
        discard_dead_letter(dead.offset)


# -- garbage collection ---------------------------------------------------------------------

def collect(groups: dict[str, set[str]], **overrides: Any) -> int:
    conf = dataclasses.replace(fast_settings(), **overrides)
    collector = GarbageCollector(conf, "default", groups)
    with connection.cursor() as cursor:
        return collector.collect(cursor, force=True)


def test_gc_deletes_what_every_known_group_finished(register: Any) -> None:
    register("t", "a", lambda m: None)
    register("t", "b", lambda m: None)
    sent = send_messages("t", [sqlqueue.OutgoingMessage(n, partition_key="k")
                               for n in range(10)])
    keep = fast_settings(RETENTION=3600)  # the runners must not collect on their own here
    drain_until_watermarks("a", {"k": sent[-1].offset}, conf=keep)
    # Group b is known (this process runs it) but has not consumed: nothing may go.
    assert collect({"t": {"a", "b"}}) == 0
    drain_until_watermarks("b", {"k": sent[-1].offset}, conf=keep)
    assert collect({"t": {"a", "b"}}) == 10
    assert not QueueMessage.objects.filter(topic="t").exists()


def test_gc_counts_a_stopped_group_with_an_offsets_row(register: Any) -> None:
    register("t", "a", lambda m: None)
    sent = send_message("t", 1, partition_key="k")
    # Group "stopped" registered itself once (its offsets row) and is not running now.
    PartitionOffset.objects.create(consumer_group="stopped", topic="t", partition_key="k",
                                   offset_acked=0, updated_at=0)
    drain_until_watermarks("a", {"k": sent.offset}, conf=fast_settings(RETENTION=3600))
    assert collect({"t": {"a"}}) == 0


def test_gc_never_touches_dead_letters(register: Any) -> None:
    register("t", "g", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")))
    sent = send_message("t", 1, partition_key="k")
    drain_until_watermarks("g", {"k": sent.offset})
    collect({"t": {"g"}, "t_dlq": set()})
    assert QueueMessage.objects.filter(topic="t_dlq").count() == 1


def test_gc_waits_for_retention(register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_message("t", 1, partition_key="k")
    drain_until_watermarks("g", {"k": sent.offset}, conf=fast_settings(RETENTION=3600))
    assert collect({"t": {"g"}}, RETENTION=3600) == 0
    assert QueueMessage.objects.filter(topic="t").count() == 1


def test_gc_deletes_in_bounded_batches(register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlqueue.consuming import gc

    monkeypatch.setattr(gc, "GC_BATCH", 7)  # a runner's pass: partition by partition
    monkeypatch.setattr(gc, "GC_SWEEP_WINDOW", 7)  # a forced one: by windows of offsets
    register("t", "g", lambda m: None)
    sent = send_messages("t", [sqlqueue.OutgoingMessage(n, partition_key="k")
                               for n in range(20)])
    # The runner collects too; a long RETENTION keeps it from doing so here.
    drain_until_watermarks("g", {"k": sent[-1].offset}, conf=fast_settings(RETENTION=3600))
    assert collect({"t": {"g"}}) == 7
    assert QueueMessage.objects.filter(topic="t").count() == 13


def test_a_gc_pass_makes_a_few_deletes_and_the_next_pass_goes_on(
        register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass runs on the consumer loop's thread: at most GC_DELETES_PER_PASS DELETEs,
    the partitions left at the very next pass; a partition with nothing new to collect
    costs no DELETE."""
    from sqlqueue.consuming import gc

    monkeypatch.setattr(gc, "GC_DELETES_PER_PASS", 2)
    register("t", "g", lambda m: None)
    sent = send_messages("t", [sqlqueue.OutgoingMessage(n, partition_key=f"k{n % 5}")
                               for n in range(10)])
    keep = fast_settings(RETENTION=3600)  # the runners must not collect on their own here
    drain_until_watermarks("g", {f"k{n}": sent[5 + n].offset for n in range(5)}, conf=keep)
    collector = GarbageCollector(fast_settings(), "default", {"t": {"g"}})
    deletes: list[str] = []

    def count_deletes(execute: Any, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith("DELETE FROM") and "queue_messages" in sql:
            deletes.append(sql)
        return execute(sql, *args)

    passes = []
    with connection.execute_wrapper(count_deletes), connection.cursor() as cursor:
        for force in (False, False, False, True):
            deletes.clear()
            passes.append((collector.collect(cursor, force=force), len(deletes),
                           collector._next_pass["t"] <= collector.host_clock.monotonic()))
    # The last, forced, finds every partition collected up to its watermark: no DELETE.
    assert passes == [(4, 2, True), (4, 2, True), (2, 1, False), (0, 0, False)]
    assert not QueueMessage.objects.filter(topic="t").exists()


def test_a_forced_pass_sweeps_windows_of_offsets_within_each_partition_s_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``manage.py queue gc`` deletes by windows of the primary key (one DELETE a window
    that holds rows, GC_SWEEP_WINDOW offsets wide), each partition up to what every
    group finished there; a partition no group has a position on, and other topics
    interleaved with the topic, keep their rows, and so does the delivery state of what
    stays (KEEP_DELIVERY_STATE)."""
    from sqlqueue.consuming import gc

    monkeypatch.setattr(gc, "GC_SWEEP_WINDOW", 10)
    sent = send_messages("t", [sqlqueue.OutgoingMessage(n, partition_key=f"k{n % 4}")
                               for n in range(40)])
    other = send_messages("o", [sqlqueue.OutgoingMessage(n, partition_key="k0")
                                for n in range(5)])
    by_key: dict[str, list[int]] = {}
    for n, message in enumerate(sent):
        by_key.setdefault(f"k{n % 4}", []).append(message.offset)
    # k0: both groups done with its 6 first rows; k1: "a" with all, "b" with 2;
    # k2: both with all; k3: nobody has a position (kept whole).
    positions = {("a", "k0"): by_key["k0"][5], ("b", "k0"): by_key["k0"][7],
                 ("a", "k1"): by_key["k1"][-1], ("b", "k1"): by_key["k1"][1],
                 ("a", "k2"): by_key["k2"][-1], ("b", "k2"): by_key["k2"][-1]}
    for (group, key), offset in positions.items():
        PartitionOffset.objects.create(consumer_group=group, topic="t", partition_key=key,
                                       offset_acked=offset, updated_at=0)
    conf = dataclasses.replace(fast_settings(), KEEP_DELIVERY_STATE=True)
    store = storage.store(connection)
    with connection.cursor() as cursor:
        store.write_outcomes(cursor, "a", "t", [
            OutcomeWrite(key, offset, True, 0) for key, offsets in by_key.items()
            for offset in offsets])
    collector = GarbageCollector(conf, "default", {"t": {"a", "b"}})
    deletes: list[str] = []

    def count_deletes(execute: Any, sql: str | bytes, *args: Any) -> Any:
        text = sql.decode() if isinstance(sql, bytes) else sql  # MySQL's inlined values
        if text.lstrip().upper().startswith("DELETE FROM") and "queue_messages" in text:
            deletes.append(text)
        return execute(sql, *args)

    passes = []
    with connection.execute_wrapper(count_deletes), connection.cursor() as cursor:
        while removed := collector.collect(cursor, force=True):
            passes.append(removed)
    expected_gone = set(by_key["k0"][:6] + by_key["k1"][:2] + by_key["k2"])
    assert sum(passes) == len(expected_gone) == 18
    # Rows to delete lie between the first and the last of k2's: 4 windows of 10 offsets
    # at most, each with rows, one a pass.
    assert len(passes) == len(deletes) <= 4 and all(passes)
    left = set(QueueMessage.objects.filter(topic="t").values_list("offset", flat=True))
    assert left == {m.offset for m in sent} - expected_gone
    assert QueueMessage.objects.filter(topic="o").count() == len(other)
    states = set(DeliveryState.objects.filter(consumer_group="a", topic="t")
                 .values_list("message_offset", flat=True))
    assert states == left
    with connection.cursor() as cursor:
        assert collector.collect(cursor, force=True) == 0  # every partition collected
