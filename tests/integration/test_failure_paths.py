"""Failure paths at the speed of the ack path (issue 56): a pass's dead letters in a few
statements (and one at a time when those fail), bulk replays set-based and in chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.db import DataError, connection, transaction

import sqlqueue
from sqlqueue import Message, OutgoingMessage, send_messages, storage
from sqlqueue.consuming.outcomes import DeadLetterCopy, copy_to_dead_letters
from sqlqueue.models import DeadLetter, QueueMessage
from sqlqueue.operations import dead_letters
from sqlqueue.operations.dead_letters import replay_dead_letters
from sqlqueue.storage.sql.dead_letters import DeadLetterAccess
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite
from tests.integration.consuming_helpers import drain, fast_settings, queue, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]

PARTITIONS = ("a", "b", "c")


def publish(topic: str, count: int) -> list[Any]:
    return send_messages(topic, [OutgoingMessage({"n": n}, partition_key=PARTITIONS[n % 3],
                                                 id=f"m{n}") for n in range(count)])


def spy_dead_letters(monkeypatch: pytest.MonkeyPatch,
                     fail: Any = None) -> list[list[int]]:
    """The offsets of each ``insert_dead_letters`` call; ``fail(letters)``: raise instead."""
    calls: list[list[int]] = []
    real = DeadLetterAccess.insert_dead_letters

    def insert(self: Any, cursor: Any, *, dead_letter_topic: str, group: str,
               letters: Sequence[DeadLetterWrite]) -> None:
        calls.append([letter.offset for letter in letters])
        if fail is not None and fail(letters):
            raise DataError("a row the set statement cannot take")
        real(self, cursor, dead_letter_topic=dead_letter_topic, group=group, letters=letters)

    monkeypatch.setattr(DeadLetterAccess, "insert_dead_letters", insert)
    return calls


def dead_ids(topic: str) -> list[str]:
    return sorted(QueueMessage.objects.filter(topic=topic).values_list("id", flat=True))


def test_a_flood_of_rejects_is_dead_lettered_a_pass_at_a_time(
        register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_dead_letters(monkeypatch)

    def reject(message: Message) -> None:
        raise sqlqueue.Reject("no")

    register("flood", "g", reject)
    sent = publish("flood", 120)
    runner = drain(["g"])
    # Each dead letter once, with its id per (message, group); the drain ended: each acked.
    assert dead_ids("flood_dlq") == sorted(f"m{n}@g" for n in range(120))
    assert sorted(o for call in calls for o in call) == sorted(s.offset for s in sent)
    assert len(calls) < 120 // 4, calls  # many a statement, not one each
    assert runner.subscribers[0].stats["dead_lettered"] == 120


def test_when_the_set_statement_fails_each_is_written_alone(
        register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row the set statement cannot take (its first try only) fails no other outcome
    of the pass: the others are dead-lettered one at a time, the acks of the pass are
    written, and that one is delivered again and dead-lettered then (guarantee I7: never
    a dead letter without its ack, nor twice)."""
    sent = publish("mixed", 30)
    bad = sent[1].offset
    tries = {"bad": 0}

    def fail(letters: Sequence[DeadLetterWrite]) -> bool:
        if len(letters) > 1:
            return True
        if letters[0].offset == bad:
            tries["bad"] += 1
            return tries["bad"] == 1
        return False

    calls = spy_dead_letters(monkeypatch, fail)

    def odd_rejected(message: Message) -> None:
        if message.payload["n"] % 2:
            raise sqlqueue.Reject("odd")

    register("mixed", "g", odd_rejected)
    runner = drain(["g"], conf=fast_settings(VISIBILITY_TIMEOUT=1))
    assert dead_ids("mixed_dlq") == sorted(f"m{n}@g" for n in range(1, 30, 2))
    stats = runner.subscribers[0].stats
    assert (stats["acked"], stats["dead_lettered"]) == (15, 15)
    assert any(len(call) > 1 for call in calls) and tries["bad"] == 2
    assert QueueMessage.objects.get(topic="mixed_dlq", id="m1@g").failure_count == 2


def dead_letter(count: int) -> list[int]:
    """``count`` messages of "orders" copied to its dead letters for "g" (not acked: no
    consumer here), in one call; their dead letters' offsets."""
    sent = publish("orders", count)
    with transaction.atomic(), connection.cursor() as cursor:
        copy_to_dead_letters(cursor, storage.store(connection), dead_letter_topic="orders_dlq",
                             group="g", copies=[DeadLetterCopy(s.id, s.offset, 3, "boom",
                                                               "max_attempts") for s in sent])
    return list(DeadLetter.objects.order_by("offset").values_list("offset", flat=True))


def replays() -> list[tuple[str, str]]:
    """(partition, id) of the replays in "orders", in offset order."""
    return list(QueueMessage.objects.filter(topic="orders", consumer_group="g")
                .order_by("offset").values_list("partition_key", "id"))


@pytest.mark.parametrize("count", [1, 7, 8, 15])
def test_a_bulk_replay_moves_each_dead_letter_once_in_order(
        count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters, "REPLAY_CHUNK", 7)
    offsets = dead_letter(count)
    progress: list[int] = []
    result = replay_dead_letters([*offsets, 10**12], on_progress=progress.append)
    assert (result.done, result.missing) == (count, [10**12])
    assert progress[-1] == count + 1 and progress == sorted(progress)
    assert not DeadLetter.objects.exists()
    # Each once, addressed to "g", in its partition's order (the dead letters' order).
    expected = [("abc"[n % 3], f"m{n}~replay-{o}") for n, o in enumerate(offsets)]
    assert replays() == expected
    for partition in PARTITIONS:
        mine = [r for r in replays() if r[0] == partition]
        assert mine == [e for e in expected if e[0] == partition]


def test_an_interrupted_replay_loses_and_duplicates_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters, "REPLAY_CHUNK", 5)
    offsets = dead_letter(17)
    real = DeadLetterAccess.delete_dead_letters
    deletes = {"n": 0}

    def delete(self: Any, cursor: Any, chosen: Sequence[int]) -> int:
        deletes["n"] += 1
        if deletes["n"] == 3:
            raise DataError("the connection went away")
        return real(self, cursor, chosen)

    monkeypatch.setattr(DeadLetterAccess, "delete_dead_letters", delete)
    with pytest.raises(DataError):
        replay_dead_letters(offsets)
    # Two chunks done, the third rolled back whole (its copies too), the rest untouched.
    assert len(replays()) == 10
    assert list(DeadLetter.objects.order_by("offset").values_list("offset", flat=True)) == (
        offsets[10:])
    result = replay_dead_letters(offsets)
    assert (result.done, len(result.missing)) == (7, 10)
    assert len(replays()) == 17 and len(set(replays())) == 17
    assert not DeadLetter.objects.exists()


def test_the_command_replays_at_most_what_it_is_told_oldest_first() -> None:
    offsets = dead_letter(12)
    out = queue("dead-letters", "replay", "--all", "--group", "g", "--at-most", "5")
    assert "More than 5 match" in out and "Replayed 5 dead letter(s)." in out
    # Partition by partition, each oldest first: partition "a"'s 4, then "b"'s first.
    by_partition = sorted(offsets, key=lambda o: ("abc"[offsets.index(o) % 3], o))
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == sorted(
        by_partition[5:])
    assert "Replayed 7 dead letter(s)." in queue("dead-letters", "replay", "--all")
    assert len(replays()) == 12


def test_a_walk_replays_what_matches_at_most_its_bound_and_says_if_more_match(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``replay_matching``: steps of the index (3 entries here), the filter applied to
    each step, at most ``at_most`` replayed partition by partition, oldest first; then
    whether more match."""
    monkeypatch.setattr(dead_letters, "REPLAY_CHUNK", 3)
    offsets = dead_letter(12)  # partitions a, b, c in turn
    even = DeadLetter.objects.filter(offset__in=offsets[::2])  # a: 0 6, b: 4 10, c: 2 8
    progress: list[int] = []
    result = dead_letters.replay_matching(["orders_dlq", "none_dlq"], even, at_most=3,
                                          on_progress=progress.append)
    assert (result.done, result.more, progress) == (3, True, [2, 3])
    assert [i for _, i in replays()] == [
        f"m{n}~replay-{offsets[n]}" for n in (0, 6, 4)]
    result = dead_letters.replay_matching(["orders_dlq"], even, at_most=3)
    assert (result.done, result.more) == (3, False)
    assert sorted(i for _, i in replays()) == sorted(
        f"m{n}~replay-{offsets[n]}" for n in range(0, 12, 2))
    # The odd ones stay; the command's --all walks every dead-letter topic.
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == offsets[1::2]
    result = dead_letters.replay_dead_letters_of(using="default", at_most=6)
    assert (result.done, result.more) == (6, False)
    assert not DeadLetter.objects.exists()


def test_a_walk_that_fails_between_its_statements_leaves_each_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after a step's INSERT ... SELECT and before its DELETE (a lost
    connection) rolls the step back whole: each message is a dead letter or replayed,
    never both, never neither; the next walk replays the rest."""
    monkeypatch.setattr(dead_letters, "REPLAY_CHUNK", 4)
    offsets = dead_letter(10)
    real = DeadLetterAccess.delete_dead_letters
    calls = {"n": 0}

    def delete(self: Any, cursor: Any, chosen: Sequence[int]) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise DataError("the connection went away")
        return real(self, cursor, chosen)

    monkeypatch.setattr(DeadLetterAccess, "delete_dead_letters", delete)
    with pytest.raises(DataError):
        dead_letters.replay_matching(["orders_dlq"])
    left = set(DeadLetter.objects.values_list("offset", flat=True))
    copied = {int(i.rsplit("-", 1)[1]) for _, i in replays()}
    assert len(copied) == 4 and not copied & left and copied | left == set(offsets)
    result = dead_letters.replay_matching(["orders_dlq"])
    assert (result.done, result.more) == (6, False)
    assert len(replays()) == 10 and not DeadLetter.objects.exists()
