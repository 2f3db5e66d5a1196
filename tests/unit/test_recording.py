"""What to write for handler outcomes, decided without a database
(sqlqueue.consuming.recording.plan): acks, retries and their backoff, dead letters,
give-backs, and outcomes no longer trusted."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.outcomes import Ack, RetryAt
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.recording import DeadLetterOrder, GiveBack, Plan, plan
from sqlqueue.consuming.registry import Consumer, ConsumerOptions
from tests.unit.test_consuming_units import row

NOW = 1_700_000_000_000
OPTIONS = ConsumerOptions(max_attempts=3, visibility_timeout=30, batch_size=10,
                          min_backoff=1, max_backoff=60)
CONSUMER = Consumer("t", "g", lambda message: None)
NO_JITTER = random.Random()
NO_JITTER.random = lambda: 0.0  # type: ignore[method-assign]


class Held:
    """A subscriber's view: the partitions it holds and the deliveries it handed out."""

    def __init__(self, tenure: int = 1) -> None:
        self.partitions = {"k": PartitionState("k", watermark=0, tenure=tenure)}
        self.outstanding: dict[int, Delivery] = {}

    def deliver(self, offset: int, *, retry_count: int | None = None,
                tenure: int = 1) -> Delivery:
        """Fetch ``offset`` (a state row with ``retry_count``, None: never delivered) and
        deliver it."""
        state = self.partitions["k"]
        (entry,) = state.absorb([row(offset, retry_count=retry_count)], "g")
        state.dispatched(entry, NOW + 30_000)
        assert entry.row is not None
        delivery = Delivery(CONSUMER, "default", "k", entry.row, entry.attempt, offset,
                            tenure=tenure)
        self.outstanding[id(delivery)] = delivery
        return delivery

    def plan(self, *outcomes: Outcome, **options: Any) -> Plan:
        return plan(outcomes, outstanding=self.outstanding, partitions=self.partitions,
                    options=ConsumerOptions(**{**OPTIONS.__dict__, **options}), now_ms=NOW,
                    rng=NO_JITTER)


def test_a_returned_handler_is_acked() -> None:
    held = Held()
    delivery = held.deliver(1)
    decided = held.plan(Outcome(delivery, "ack"))
    assert decided.acks == [delivery] and decided.finished == [delivery]
    assert decided.ack_writes() == [Ack("k", 1)]
    assert not (decided.retries or decided.dead_letters or decided.give_backs)


def test_an_atomic_handler_acked_already() -> None:
    held = Held()
    delivery = held.deliver(1)
    decided = held.plan(Outcome(delivery, "acked"))
    assert decided.acks == [] and decided.finished == [delivery]  # done, no write


def test_a_failure_is_retried_after_the_backoff() -> None:
    held = Held()
    first, second = held.deliver(1), held.deliver(2, retry_count=0)  # attempts 1 and 2
    decided = held.plan(Outcome(first, "fail", error="boom"), Outcome(second, "fail"),
                        max_attempts=5)
    # min(max_backoff, min_backoff x 2^(attempt-1)), no jitter here
    assert [(r.delivery, r.delay_ms, r.invisible_until) for r in decided.retries] == [
        (first, 1_000, NOW + 1_000), (second, 2_000, NOW + 2_000)]
    assert decided.retries[0].write() == RetryAt("k", 1, NOW + 1_000, "boom")
    assert decided.retries[0].stamped(NOW + 700).invisible_until == NOW + 1_700
    assert decided.acks == [] and decided.dead_letters == []


def test_the_backoff_is_capped_and_jittered() -> None:
    held = Held()
    delivery = held.deliver(1, retry_count=18)  # attempt 20
    (capped,) = plan([Outcome(delivery, "fail")], outstanding=held.outstanding,
                     partitions=held.partitions,
                     options=ConsumerOptions(**{**OPTIONS.__dict__, "max_attempts": 50}),
                     now_ms=NOW, rng=random.Random(3)).retries
    assert 60_000 <= capped.delay_ms <= 60_000 * 1.33 + 1


def test_a_retry_asked_for_waits_its_own_delay() -> None:
    held = Held()
    delivery = held.deliver(1)
    (retry,) = held.plan(Outcome(delivery, "retry", error="later", delay=7.5)).retries
    assert (retry.delay_ms, retry.invisible_until, retry.error) == (7_500, NOW + 7_500, "later")


def test_the_last_attempt_is_dead_lettered() -> None:
    held = Held()
    delivery = held.deliver(1, retry_count=0)  # attempt 2 of 2
    decided = held.plan(Outcome(delivery, "fail", error="boom"), max_attempts=2)
    assert decided.dead_letters == [DeadLetterOrder(delivery, "max_attempts", "boom")]
    assert decided.retries == [] and decided.acks == []


def test_a_retry_asked_for_on_the_last_attempt_is_dead_lettered_too() -> None:
    held = Held()
    delivery = held.deliver(1, retry_count=1)  # attempt 3 of 3
    decided = held.plan(Outcome(delivery, "retry", delay=1.0))
    assert decided.dead_letters == [DeadLetterOrder(delivery, "max_attempts", "")]


def test_a_rejection_is_dead_lettered_at_once() -> None:
    held = Held()
    delivery = held.deliver(1)
    decided = held.plan(Outcome(delivery, "reject", error="bad payload"))
    assert decided.dead_letters == [DeadLetterOrder(delivery, "rejected", "bad payload")]


@pytest.mark.parametrize(("retry_count", "previous"), [(None, None), (0, 0), (3, 3)])
def test_a_delivery_no_handler_started_is_given_back(retry_count: int | None,
                                                      previous: int | None) -> None:
    held = Held()
    delivery = held.deliver(1, retry_count=retry_count)
    decided = held.plan(Outcome(delivery, "not_started"))
    # The retry count the row had before this delivery: no attempt charged.
    assert decided.give_backs == [GiveBack(delivery, previous)]
    assert not (decided.acks or decided.retries or decided.dead_letters)


def test_outcomes_no_longer_trusted_are_dropped() -> None:
    held = Held(tenure=2)
    stale = held.deliver(1, tenure=1)  # delivered in the lease's last tenure
    elsewhere = held.deliver(2, tenure=2)
    del held.outstanding[id(elsewhere)]  # made on a server no longer talked to
    decided = held.plan(Outcome(stale, "ack"), Outcome(elsewhere, "ack"))
    assert decided.abandoned == 2 and decided.acks == []
    lost = Held()
    gone = lost.deliver(1)
    del lost.partitions["k"]  # the lease went elsewhere
    assert lost.plan(Outcome(gone, "not_started")).abandoned == 1


def test_a_late_word_from_an_overtaken_attempt_is_ignored_but_for_an_ack() -> None:
    held = Held()
    first = held.deliver(1)
    entry = held.partitions["k"].entries[1]
    held.partitions["k"].dispatched(entry, NOW)  # delivered again: attempt 2 runs
    decided = held.plan(Outcome(first, "fail"), Outcome(first, "not_started"))
    assert not (decided.retries or decided.give_backs or decided.dead_letters)
    assert held.plan(Outcome(first, "ack")).acks == [first]  # done is done


# -- one write per message (two deliveries of one message answering in one batch) -------

def redelivered(held: Held) -> tuple[Delivery, Delivery]:
    """The first delivery of offset 1 outlived its timeout; a second went out."""
    first = held.deliver(1)
    state = held.partitions["k"]
    entry = state.entries[1]
    state.dispatched(entry, NOW + 60_000)
    assert entry.row is not None
    second = Delivery(CONSUMER, "default", "k", entry.row, entry.attempt, 2, tenure=1)
    held.outstanding[id(second)] = second
    return first, second


def test_two_acks_of_one_message_write_one() -> None:
    """Two ack rows for one key in one upsert: PostgreSQL refused the statement ("ON
    CONFLICT DO UPDATE command cannot affect row a second time") and the runner retried
    the batch forever; the history checker found it (tests/history)."""
    held = Held()
    first, second = redelivered(held)
    decided = held.plan(Outcome(first, "ack"), Outcome(second, "ack"))
    assert decided.ack_writes() == [Ack("k", 1)]
    assert decided.abandoned == 1


def test_an_ack_beats_a_retry_of_the_same_message() -> None:
    held = Held()
    first, second = redelivered(held)
    decided = held.plan(Outcome(second, "fail", error="boom"), Outcome(first, "ack"))
    assert decided.ack_writes() == [Ack("k", 1)] and decided.retries == []


def test_an_atomic_ack_beats_a_give_back() -> None:
    held = Held()
    first, second = redelivered(held)
    decided = held.plan(Outcome(first, "acked"), Outcome(second, "not_started"))
    assert decided.acked == [first] and decided.give_backs == []


@pytest.mark.parametrize("kind", ["fail", "reject", "not_started"])
def test_a_message_done_already_gets_no_retry_dead_letter_or_give_back(kind: str) -> None:
    """Attempt 1's late ack finished the message while the redelivery (attempt 3, its
    last) still ran; that one then fails: the message was handled, and neither a retry,
    a dead letter nor a give-back is written for it."""
    held = Held()
    delivery = held.deliver(1, retry_count=1)  # attempt 3 = max_attempts
    held.partitions["k"].finished(1, attempt=1)
    decided = held.plan(Outcome(delivery, kind, error="RuntimeError: late"))
    assert decided == Plan()
