"""Deciding what to write for the outcomes handlers sent back: no database, no cursor.

``plan`` turns outcomes into a ``Plan``: acks, retries (with their backoff and the time
they become visible again, guarantee I9), dead letters (rejected, or out of attempts, guarantee I7)
and give-backs (a delivery no handler started: no attempt charged). Outcomes of
deliveries this subscriber no longer trusts are dropped: made on another server, or on a
partition whose lease went elsewhere or came back in a new tenure (the owner
delivers them again after their visibility timeout: at least once, never acked by a
stranger). ``OutcomeRecorder.record`` writes the plan (sqlqueue.consuming.outcomes).
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field, replace

from sqlqueue.consuming.backoff import retry_delay
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.outcomes import Ack, RetryAt
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import ConsumerOptions


@dataclass(frozen=True)
class RetryOrder:
    """Another attempt after ``delay_ms``: not visible before ``invisible_until``."""

    delivery: Delivery
    delay_ms: int
    error: str
    invisible_until: int

    def stamped(self, now_ms: int) -> RetryOrder:
        """The same retry with its delay counted from ``now_ms``."""
        return replace(self, invisible_until=now_ms + self.delay_ms)

    def write(self) -> RetryAt:
        return RetryAt(self.delivery.partition_key, self.delivery.row.offset,
                       self.invisible_until, self.error)


@dataclass(frozen=True)
class DeadLetterOrder:
    delivery: Delivery
    reason: str  # "rejected", "max_attempts" (and "crashed", decided at delivery)
    error: str


@dataclass(frozen=True)
class GiveBack:
    delivery: Delivery
    previous_retry_count: int | None  # the attempt before this delivery (None: none)


@dataclass
class Plan:
    acks: list[Delivery] = field(default_factory=list)  # to ack now
    acked: list[Delivery] = field(default_factory=list)  # an atomic handler acked already
    retries: list[RetryOrder] = field(default_factory=list)
    dead_letters: list[DeadLetterOrder] = field(default_factory=list)
    give_backs: list[GiveBack] = field(default_factory=list)
    abandoned: int = 0  # outcomes dropped: this subscriber no longer trusts the delivery

    @property
    def finished(self) -> list[Delivery]:
        """Done for good once written (not the dead letters: counted on their own)."""
        return self.acks + self.acked

    def ack_writes(self) -> list[Ack]:
        return [Ack(d.partition_key, d.row.offset) for d in self.acks]


def plan(outcomes: Iterable[Outcome], *, outstanding: Container[int],
         partitions: Mapping[str, PartitionState], options: ConsumerOptions, now_ms: int,
         rng: random.Random | None = None) -> Plan:
    """What to write for ``outcomes``. ``outstanding``: ids of the deliveries this
    subscriber handed out and still answers for; ``partitions``: the partitions it holds
    (with their lease's tenure); ``now_ms``: the database clock; ``rng``: the backoff's
    jitter."""
    decided = Plan()
    for outcome in outcomes:
        delivery = outcome.delivery
        if id(delivery) not in outstanding:
            # Made on a server this subscriber no longer talks to (forget_server).
            decided.abandoned += 1
            continue
        key, offset = delivery.partition_key, delivery.row.offset
        state = partitions.get(key)
        if state is None or state.tenure != delivery.tenure:
            # The lease went elsewhere (or came back: another tenure, whatever its
            # generation).
            decided.abandoned += 1
            continue
        entry = state.entries.get(offset)
        if (entry is not None and (entry.attempt > delivery.attempt or entry.done)
                and outcome.kind not in ("ack", "acked")):
            # A late word from an attempt that was overtaken by a redelivery (an ack
            # still counts: the message was handled; an atomic one is committed), or a
            # failure of a message already done (the late ack of an earlier attempt):
            # no retry, no dead letter of a message that was handled.
            continue
        if outcome.kind == "not_started":
            # The attempt before this delivery: none at all for a first delivery.
            previous = entry.previous_retry_count if entry else (
                None if delivery.attempt == 1 else delivery.attempt - 2
            )
            decided.give_backs.append(GiveBack(delivery, previous))
        elif outcome.kind == "ack":
            decided.acks.append(delivery)
        elif outcome.kind == "acked":
            decided.acked.append(delivery)
        elif outcome.kind == "reject" or delivery.attempt >= options.max_attempts:
            reason = "rejected" if outcome.kind == "reject" else "max_attempts"
            decided.dead_letters.append(DeadLetterOrder(delivery, reason, outcome.error))
        else:
            delay = outcome.delay
            if delay is None:
                delay = retry_delay(delivery.attempt, options.min_backoff, options.max_backoff,
                                    rng)
            delay_ms = round(1000 * delay)
            decided.retries.append(RetryOrder(delivery, delay_ms, outcome.error, now_ms + delay_ms))
    return _one_write_per_message(decided)


def _one_write_per_message(decided: Plan) -> Plan:
    """At most one outcome per message: two deliveries of one message (a redelivery past
    the visibility timeout, and the first one's late word) can both answer in one batch.
    One statement must not write a row twice (PostgreSQL refuses: "ON CONFLICT DO UPDATE
    command cannot affect row a second time", and the batch was retried forever, holding
    every outcome of the runner). Done beats retrying: an ack or a dead letter wins, and
    of two retries the later attempt's."""
    def key(delivery: Delivery) -> tuple[str, int]:
        return delivery.partition_key, delivery.row.offset

    done: set[tuple[str, int]] = set()
    acks, acked, dead_letters = [], [], []
    for delivery in decided.acks:
        if key(delivery) not in done:
            done.add(key(delivery))
            acks.append(delivery)
    for delivery in decided.acked:
        if key(delivery) not in done:
            done.add(key(delivery))
            acked.append(delivery)
    for dead in decided.dead_letters:
        if key(dead.delivery) not in done:
            done.add(key(dead.delivery))
            dead_letters.append(dead)
    latest: dict[tuple[str, int], RetryOrder] = {}
    for retry in decided.retries:
        seen = latest.get(key(retry.delivery))
        if key(retry.delivery) not in done and (
                seen is None or retry.delivery.attempt > seen.delivery.attempt):
            latest[key(retry.delivery)] = retry
    give_backs = [g for g in decided.give_backs
                  if key(g.delivery) not in done and key(g.delivery) not in latest]
    dropped = (len(decided.acks) + len(decided.acked) + len(decided.dead_letters)
               + len(decided.retries) + len(decided.give_backs)
               - len(acks) - len(acked) - len(dead_letters) - len(latest) - len(give_backs))
    return Plan(acks, acked, list(latest.values()), dead_letters, give_backs,
                decided.abandoned + dropped)
