"""Batch consumers (``@sqlqueue.batch_consumer``): a handler call of many deliveries.

A batch group's deliveries are cut into ``Batch`` work items (``split``) that a handler
thread takes whole; ``run_batch`` calls the handler once with their messages and turns
what it did into one ``Outcome`` per delivery, the same outcomes a consumer of one message
per call sends back: the ``OutcomeRecorder`` writes them with the others (their acks and
retries in one statement). Before the call each delivery is checked as a single one is
(``Delivery.start``, the ``HeldView``): one that may not start is given back.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db import Error as AnyDatabaseError
from django.db import connections, transaction

from sqlqueue import events
from sqlqueue.consuming.clock import HostClock
from sqlqueue.consuming.failure_text import described
from sqlqueue.consuming.handlers import (
    Delivery,
    Outcome,
    build_message,
    call_handler,
    confirm_server,
    failure_outcome,
)
from sqlqueue.consuming.message import Message
from sqlqueue.consuming.outcomes import DeliveredAck, ack_delivered
from sqlqueue.consuming.registry import Consumer
from sqlqueue.exceptions import SqlqueueError

logger = logging.getLogger("sqlqueue.consumer")

_runs = itertools.count(1)  # a batch's ``Delivery.run``: one id per handler call


@dataclass(eq=False)
class Batch:
    """Deliveries of one batch consumer that one handler call takes (offset order within
    a partition; an ordered consumer's: one partition)."""

    deliveries: list[Delivery]

    def sort_key(self) -> tuple[int, float, int]:
        """Its place in the pool's queue: its best delivery's (unique, so never a tie;
        one of a healthy partition's, if any: ``fairness``)."""
        return min(delivery.sort_key() for delivery in self.deliveries)


class BadBatchResult(SqlqueueError):
    """A batch handler returned something else than None or a mapping of its messages."""


def split(consumer: Consumer, deliveries: Sequence[Delivery]) -> list[Batch]:
    """``deliveries`` (of ``consumer``, a batch consumer) cut into batches of at most
    ``max_batch``. Ordered: one partition per batch, in offset order (each partition's
    deliveries of a pass are consecutive messages: ``PartitionState.ready``)."""
    size = consumer.max_batch or 1
    if not consumer.ordered:
        return [Batch(list(deliveries[i:i + size])) for i in range(0, len(deliveries), size)]
    by_partition: dict[str, list[Delivery]] = {}
    for delivery in deliveries:
        by_partition.setdefault(delivery.partition_key, []).append(delivery)
    batches = []
    for run in by_partition.values():
        run.sort(key=lambda d: d.row.offset)
        batches += [Batch(run[i:i + size]) for i in range(0, len(run), size)]
    return batches


class Filling:
    """Deliveries of unordered batch consumers held back to fill a batch, up to the
    consumer's ``max_wait`` after the first was held. They are delivered already (marked,
    outstanding, queued): a held delivery is one waiting in the pool's queue, given back
    like one (shutdown, handover) and kept visible by the fetcher. Holding here rather than
    in the fetch keeps the runner's pass from waiting: it goes on with every subscription,
    and the next pass, or the wait the runner sets to the first deadline (``next_in``),
    hands out what is due. ``HandlerPool`` owns one."""

    def __init__(self, host_clock: HostClock) -> None:
        self.host_clock = host_clock
        #: by consumer: when the first of its held deliveries was held, and them
        self.held: dict[int, tuple[float, list[Delivery]]] = {}

    def add(self, consumer: Consumer, deliveries: Sequence[Delivery]) -> list[Batch]:
        """Hold ``deliveries`` with those already held; returns the full batches (and all
        of them if the consumer does not wait: ``max_wait`` 0, or ordered)."""
        if consumer.max_wait <= 0 or consumer.ordered:
            return split(consumer, deliveries)
        since, held = self.held.pop(id(consumer), (self.host_clock.monotonic(), []))
        held += deliveries
        size = consumer.max_batch or 1
        full = len(held) - len(held) % size
        if full < len(held):
            self.held[id(consumer)] = (since, held[full:])
        return split(consumer, held[:full])

    def due(self, everything: bool = False) -> list[Batch]:
        """The batches held past their consumer's ``max_wait`` (``everything``: all of
        them, for ``sqlqueue.testing``, which runs what is deliverable now)."""
        now = self.host_clock.monotonic()
        batches = []
        for key, (since, held) in list(self.held.items()):
            consumer = held[0].consumer
            if everything or now - since >= consumer.max_wait:
                del self.held[key]
                batches += split(consumer, held)
        return batches

    def next_in(self) -> float | None:
        """Seconds until the first held batch is due (None: none is held)."""
        if not self.held:
            return None
        now = self.host_clock.monotonic()
        return max(0.0, min(since + held[0].consumer.max_wait - now
                            for since, held in self.held.values()))

    def release(self) -> list[Delivery]:
        """Everything held (shutdown: given back with the pool's queue)."""
        released = [delivery for _, held in self.held.values() for delivery in held]
        self.held.clear()
        return released


def start_all(deliveries: Sequence[Delivery],
              ordered: bool) -> tuple[list[Delivery], list[Delivery]]:
    """Claim each delivery of a batch for this handler thread (``Delivery.start``): the
    started ones, and those refused (a lease no longer trusted, a visibility timeout run
    out: given back, not started). Ordered: none starts after one that may not, so a
    batch stays consecutive messages (those after it are given back with it)."""
    started: list[Delivery] = []
    refused: list[Delivery] = []
    for delivery in deliveries:
        if ordered and refused:
            if delivery.give_back():
                refused.append(delivery)
            continue
        if delivery.start():
            started.append(delivery)
        elif delivery.refused:
            refused.append(delivery)
    run = next(_runs)
    if started:
        # One call: one start time (its timeout is the whole call's) and one run id.
        first = started[0].started_at
        for delivery in started:
            delivery.started_at, delivery.run = first, run
    return started, refused


def run_batch(deliveries: list[Delivery]) -> list[Outcome]:
    """Call the batch handler once with the messages of ``deliveries`` (started, same
    consumer, offset order within a partition); one outcome per delivery. Never raises
    (a handler's exception is an outcome of every delivery)."""
    consumer = deliveries[0].consumer
    try:
        if consumer.atomic:
            return _run_atomic(deliveries)
        messages = [build_message(delivery) for delivery in deliveries]
        result = call_handler(consumer.handler, messages)  # type: ignore[arg-type]
        return outcomes_of(deliveries, messages, result, "ack")
    except KeyboardInterrupt:
        raise  # ^C where handlers run on the caller's thread (sqlqueue.testing): stop
    except BaseException as exc:  # SystemExit, a custom BaseException: an outcome too
        if isinstance(exc, AnyDatabaseError):
            _after_database_error(deliveries[0].alias)
        _log_failure(deliveries, exc)
        return failed(deliveries, exc)


def outcomes_of(deliveries: Sequence[Delivery], messages: Sequence[Message], result: object,
                done: str) -> list[Outcome]:
    """What a batch handler's ``result`` means for each delivery: None, every one done
    (``done``: "ack", or "acked" when an atomic call wrote the acks); a mapping of some of
    its messages to an exception, those fail with it and the others are done. Raises
    ``BadBatchResult`` for anything else, or a key not among ``messages``. Ordered: those
    after the first failure are given back (no attempt charged), to wait behind it."""
    failures: dict[int, BaseException] = {}
    if result is not None:
        if not isinstance(result, Mapping):
            raise BadBatchResult(
                f"A batch handler returns None or a mapping {{message: exception}}; "
                f"{_name(deliveries[0].consumer)} returned {type(result).__name__}.")
        index = {id(message): n for n, message in enumerate(messages)}
        for message, exc in result.items():
            if id(message) not in index:
                raise BadBatchResult(
                    f"{_name(deliveries[0].consumer)} returned a failure for {message!r}, "
                    "which is not a message of its batch (key the mapping by the Message "
                    "objects it was called with).")
            if not isinstance(exc, BaseException):
                raise BadBatchResult(
                    f"{_name(deliveries[0].consumer)} returned {exc!r} for "
                    f"{_where(deliveries[index[id(message)]])}: the mapping's values are "
                    "exceptions (Reject(...), Retry(delay=...) or any other).")
            failures[index[id(message)]] = exc
    ordered = deliveries[0].consumer.ordered
    first_failure = min(failures, default=len(deliveries))
    outcomes = []
    for n, delivery in enumerate(deliveries):
        if n in failures and not (ordered and n > first_failure):
            outcomes.append(failure_outcome(delivery, failures[n]))
        elif ordered and n > first_failure:
            outcomes.append(Outcome(delivery, "not_started"))
        else:
            outcomes.append(Outcome(delivery, done))  # type: ignore[arg-type]
    if failures:
        _log_mapped(deliveries, failures)
    return outcomes


def failed(deliveries: Sequence[Delivery], exc: BaseException) -> list[Outcome]:
    """Every delivery of a batch whose handler raised ``exc`` fails with it. Ordered: the
    first fails, those after it are given back and wait behind it (no attempt charged)."""
    if deliveries[0].consumer.ordered:
        return [failure_outcome(deliveries[0], exc),
                *(Outcome(delivery, "not_started") for delivery in deliveries[1:])]
    return [failure_outcome(delivery, exc) for delivery in deliveries]


def _run_atomic(deliveries: list[Delivery]) -> list[Outcome]:
    """The handler's writes and the acks of its batch commit together, or not at all
    (guarantee I13): the acks in one statement, in the handler's transaction. A handler
    that raises, or returns what is not a mapping of its messages, rolls both back.
    Failures of a mapping are recorded by the runner after the commit (their retry or
    dead letter needs its view of the partition: docs/guides/consuming.md)."""
    alias, consumer = deliveries[0].alias, deliveries[0].consumer
    with transaction.atomic(using=alias):
        # Opening the transaction can take longer than what was left of a visibility
        # timeout: each delivery is asked again (ordered: none after one that may not).
        ready: list[Delivery] = []
        late: list[Delivery] = []
        for delivery in deliveries:
            if (late and consumer.ordered) or not delivery.view.may_start(delivery):
                late.append(delivery)
            else:
                ready.append(delivery)
        if not ready:
            return [Outcome(delivery, "not_started") for delivery in late]
        messages = [build_message(delivery) for delivery in ready]
        result = call_handler(consumer.handler, messages)  # type: ignore[arg-type]
        outcomes = outcomes_of(ready, messages, result, "acked")
        confirm_server(ready[0])
        ack_delivered(alias, consumer.group, consumer.topic, [
            DeliveredAck(o.delivery.partition_key, o.delivery.row.offset, o.delivery.attempt)
            for o in outcomes if o.kind == "acked"])
    return outcomes + [Outcome(delivery, "not_started") for delivery in late]


def _after_database_error(alias: str) -> None:
    """As a single handler's: the savepoint rolled back inside a caller's transaction
    (sqlqueue.testing), else a fresh connection for the next call."""
    connection = connections[alias]
    if connection.in_atomic_block:
        transaction.set_rollback(True, using=alias)
    else:
        connection.close()


def _log_failure(deliveries: Sequence[Delivery], exc: BaseException) -> None:
    """One line for the batch (not one per message)."""
    consumer, first = deliveries[0].consumer, deliveries[0]
    description = described(exc)
    logger.warning(
        "Batch handler %s failed on %s message(s) from %s: %s", _name(consumer),
        len(deliveries), _where(first), description,
        extra=events.fields(events.HANDLER_FAILED, group=consumer.group,
                            topic=consumer.topic, partition=first.partition_key,
                            offset=first.row.offset, attempt=first.attempt,
                            error=description, subject=f"batch of {len(deliveries)}"))


def _log_mapped(deliveries: Sequence[Delivery], failures: Mapping[int, BaseException]) -> None:
    first = deliveries[min(failures)]
    logger.warning("Batch handler %s returned %s failure(s) of %s message(s); the first: "
                   "%s: %s", _name(first.consumer), len(failures), len(deliveries),
                   _where(first), described(failures[min(failures)]))


def _name(consumer: Consumer) -> str:
    return consumer.name


def _where(delivery: Delivery) -> str:
    return f"{delivery.consumer.topic}/{delivery.partition_key}@{delivery.row.offset}"
