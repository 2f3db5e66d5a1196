"""A subscription's outcome recording: the ``OutcomeRecorder``.

What the handlers did is written inside the pass's fenced transaction: ``recording.plan``
decides (a give-back, a dead letter, an ack or a retry), ``record_plan`` records it
through ``outcomes`` (the one writer of delivery state), and the partitions' windows
follow; once the transaction commits, ``committed`` answers the deliveries in the
``Deliveries`` ledger. One word per step: outcomes are *recorded* (never "written" here:
the statement's name, ``write_outcomes``, is the storage layer's). Its ``Subscriber``
owns one; it is the one writer of the subscription's counts (``stats``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import Error as AnyDatabaseError
from django.db import transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue import events, storage
from sqlqueue.consuming import recording
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.delivering import RESTAMP_AFTER_MS
from sqlqueue.consuming.handlers import Delivery, Outcome, published_id, subject_of
from sqlqueue.consuming.ledger import Deliveries, FailingPartitions
from sqlqueue.consuming.logholding import (
    DEAD_LETTER_LINES,
    HANDLER_FAILURE_LINES,
    Failure,
    FailureLog,
)
from sqlqueue.consuming.outcomes import (
    Ack,
    DeadLetterCopy,
    GiveBackOrder,
    copy_to_dead_letters,
    give_back,
    write_acks,
)
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import Consumer, ConsumerOptions

logger = logging.getLogger("sqlqueue.consumer")


class OutcomeRecorder:
    """Writes one subscription's outcomes, as the partitions' owner."""

    def __init__(self, *, consumer: Consumer, options: ConsumerOptions, alias: str,
                 dead_letter_topic: str, clock: Callable[[], int],
                 partitions: dict[str, PartitionState], deliveries: Deliveries,
                 host_clock: HostClock = SYSTEM_CLOCK,
                 failing: FailingPartitions | None = None) -> None:
        self.group, self.topic = consumer.group, consumer.topic
        self.options = options
        self.alias = alias
        self.dead_letter_topic = dead_letter_topic
        self.clock = clock  # the database clock (epoch ms)
        self.partitions = partitions  # the Subscriber's (it adds and drops them)
        self.deliveries = deliveries  # the Subscriber's ledger
        # The Subscriber's count of failed runs in a row, told of every committed run.
        self.failing = failing or FailingPartitions()
        #: delivered, acked, retried, dead_lettered, abandoned (``Subscriber.stats``)
        self.stats: Counter[str] = Counter()
        # The flood's log lines: one per interval and kind, not one per message.
        self.failure_log = FailureLog(HANDLER_FAILURE_LINES, name=consumer.name, group=self.group,
                                      topic=self.topic, monotonic=host_clock.monotonic)
        self.dead_letter_log = FailureLog(DEAD_LETTER_LINES, name=consumer.name, group=self.group,
                                          topic=self.topic, monotonic=host_clock.monotonic)

    def delivered(self, count: int) -> None:
        self.stats["delivered"] += count

    def record(self, cursor: CursorWrapper, outcomes: Iterable[Outcome],
               defer_acks: bool = False) -> list[Ack]:
        """Record what the handlers did: ``recording.plan`` decides, ``record_plan``
        records. Deliveries stay outstanding until the caller's transaction commits (and
        calls ``committed``): a failed write is retried as the owner's, not dropped as a
        stranger's (the ack would be lost, the message run again). Nothing to record
        reads nothing (not even the clock). ``defer_acks``: the handlers' acks are not
        written but returned, for the caller to make durable in this same transaction
        (``Transactions.deliver``: the watermark covers them, or ``write_acks``)."""
        outcomes = list(outcomes)
        self.log_failures([])  # what was counted, once due
        if not outcomes:
            return []
        return self.record_plan(cursor, recording.plan(
            outcomes, outstanding=self.deliveries.outstanding, partitions=self.partitions,
            options=self.options, now_ms=self.clock()), defer_acks)

    def write_acks(self, cursor: CursorWrapper, acks: list[Ack]) -> None:
        """Acks ``record(defer_acks=True)`` returned that no watermark covered; done in
        the windows again (a window read afresh, after a reset, may have read their rows
        before this write: not acked)."""
        write_acks(cursor, storage.store(self.alias), self.group, self.topic, acks)
        for ack in acks:
            if (state := self.partitions.get(ack.partition_key)) is not None:
                state.finished(ack.offset)

    def record_plan(self, cursor: CursorWrapper, plan: recording.Plan,
                    defer_acks: bool = False) -> list[Ack]:
        """Give-backs; the dead letters' copies (a few statements for any number); then
        the acks (the dead letters' too; the handlers' not, if ``defer_acks``: returned)
        and retries of every partition in one statement; then the in-memory view
        follows."""
        self.stats["abandoned"] += plan.abandoned
        store = storage.store(self.alias)
        if plan.give_backs:
            give_back(cursor, store, self.group, self.topic, [
                GiveBackOrder(g.delivery.partition_key, g.delivery.row.offset,
                              g.previous_retry_count) for g in plan.give_backs])
        for give in plan.give_backs:
            self.partitions[give.delivery.partition_key].given_back(give.delivery.row.offset)
        copied = self._copy_dead_letters(cursor, plan.dead_letters)
        deferred = plan.ack_writes() if defer_acks else []
        retries = self._record_acks_and_retries(
            cursor, ([] if defer_acks else plan.ack_writes())
            + [_ack_of(dead.delivery) for dead in copied], plan.retries)
        self._dead_lettered(copied)
        self.stats["acked"] += len(plan.finished)
        self.stats["retried"] += len(retries)
        for delivery in plan.finished:
            self.partitions[delivery.partition_key].finished(delivery.row.offset,
                                                             delivery.attempt)
        for retry in retries:
            self.partitions[retry.delivery.partition_key].retry_at(
                retry.delivery.row.offset, retry.invisible_until)
        return deferred

    def committed(self, outcomes: Iterable[Outcome]) -> None:
        """The transaction that recorded ``outcomes`` committed: their deliveries leave the
        ledger, and their runs end in the windows."""
        outcomes = list(outcomes)
        self.deliveries.answered(outcomes)
        self.failing.ran(outcomes)
        # Counted once committed: outcomes kept after a failed write are recorded again.
        self.log_failures(outcomes)
        for outcome in outcomes:
            delivery = outcome.delivery
            if (state := self.partitions.get(delivery.partition_key)) is not None:
                state.run_ended(delivery.row.offset, delivery.attempt)

    def _record_acks_and_retries(
        self, cursor: CursorWrapper, acks: list[Ack], retries: list[recording.RetryOrder],
    ) -> list[recording.RetryOrder]:
        """Acks and retries in one statement; returns the retries as written. Their
        backoffs start from a reading of the clock taken just before; if the statement
        waited for a lock, they are stamped again from a fresh one (the locks are held by
        now), so that no wait cuts one short (guarantee I9)."""
        store = storage.store(self.alias)
        now = self.clock()
        retries = [retry.stamped(now) for retry in retries]
        write_acks(cursor, store, self.group, self.topic, acks,
                   [retry.write() for retry in retries])
        stamped_at, now = now, self.clock()
        if retries and now - stamped_at > RESTAMP_AFTER_MS:
            retries = [retry.stamped(now) for retry in retries]
            write_acks(cursor, store, self.group, self.topic, [],
                       [retry.write() for retry in retries])
        return retries

    def dead_letters(self, cursor: CursorWrapper,
                     orders: list[recording.DeadLetterOrder]) -> None:
        """Copy the messages of ``orders`` to the dead letters and ack them (guarantee I7:
        both or neither), in the caller's transaction: what a pass finds out of attempts
        (``Subscriber.poll``)."""
        if not orders:
            return
        copied = self._copy_dead_letters(cursor, orders)
        if copied:
            write_acks(cursor, storage.store(self.alias), self.group, self.topic,
                       [_ack_of(dead.delivery) for dead in copied])
        self._dead_lettered(copied)

    def _copy_dead_letters(
        self, cursor: CursorWrapper, orders: list[recording.DeadLetterOrder],
    ) -> list[recording.DeadLetterOrder]:
        """The copies of ``orders`` in the dead-letter topic, in a few statements inside a
        savepoint; returns the orders copied so, whose acks the caller writes in the same
        transaction. If that fails (not a lock wait: the pass is tried again whole), each
        is written alone, copy and ack in a savepoint of its own, so that one bad row
        does not hold the pass's other outcomes; those are not returned."""
        if not orders:
            return []
        store = storage.store(self.alias)
        try:
            with transaction.atomic(using=self.alias):
                copy_to_dead_letters(cursor, store, dead_letter_topic=self.dead_letter_topic,
                                     group=self.group, copies=[_copy_of(o) for o in orders])
        except AnyDatabaseError as exc:
            if store.is_lock_wait(exc) or len(orders) == 1:
                raise
            logger.warning("%s/%s: the %s dead letters of a pass could not be written "
                           "together (%s); writing them one at a time.", self.group,
                           self.topic, len(orders), exc)
            self._dead_lettered([o for o in orders if self._dead_letter_alone(cursor, o)])
            return []
        return orders

    def _dead_letter_alone(self, cursor: CursorWrapper,
                           order: recording.DeadLetterOrder) -> bool:
        """One dead letter, copy and ack, in a savepoint of its own; False if it could not
        be written (logged: the message stays unacked, and is delivered again once its
        visibility timeout ends)."""
        store = storage.store(self.alias)
        try:
            with transaction.atomic(using=self.alias):
                copy_to_dead_letters(cursor, store, dead_letter_topic=self.dead_letter_topic,
                                     group=self.group, copies=[_copy_of(order)])
                write_acks(cursor, store, self.group, self.topic, [_ack_of(order.delivery)])
        except AnyDatabaseError as exc:
            if store.is_lock_wait(exc):
                raise
            row = order.delivery.row
            logger.error("%s/%s@%s: could not be dead-lettered for group %r (%s); it is "
                         "delivered again after its visibility timeout.", self.topic,
                         order.delivery.partition_key, row.offset, self.group, exc)
            return False
        return True

    def _dead_lettered(self, orders: list[recording.DeadLetterOrder]) -> None:
        """Written: counted, each at DEBUG, the flood's lines (``FailureLog``), and done in
        its partition's window."""
        for order in orders:
            delivery, row = order.delivery, order.delivery.row
            subject = subject_of(delivery)
            logger.debug("Dead-lettered %s/%s@%s%s for group %r after %s attempt(s) (%s).",
                         self.topic, delivery.partition_key, row.offset,
                         f" ({subject})" if subject else "", self.group, delivery.attempt,
                         order.reason,
                         extra=events.fields(events.MESSAGE_DEAD_LETTERED, group=self.group,
                                             topic=self.topic,
                                             partition=delivery.partition_key,
                                             offset=row.offset, attempt=delivery.attempt,
                                             reason=order.reason, subject=subject))
            self.dead_letter_log.note(Failure(delivery.partition_key, row.offset,
                                              delivery.attempt, order.reason, subject))
            self.stats["dead_lettered"] += 1
            if (state := self.partitions.get(delivery.partition_key)) is not None:
                state.finished(row.offset)

    def log_failures(self, outcomes: list[Outcome]) -> None:
        """The handlers' failures among ``outcomes`` to the flood's lines (each was
        logged at DEBUG when it happened); and what was counted, once due."""
        for outcome in outcomes:
            if outcome.kind == "fail":
                delivery = outcome.delivery
                # The traceback's last line: the exception, as the dead letter's list shows it.
                text = (outcome.error.strip().splitlines() or [""])[-1]
                self.failure_log.note(Failure(delivery.partition_key, delivery.row.offset,
                                              delivery.attempt, text, outcome.subject))
        self.failure_log.flush()
        self.dead_letter_log.flush()


def _ack_of(delivery: Delivery) -> Ack:
    return Ack(delivery.partition_key, delivery.row.offset)


def _copy_of(order: recording.DeadLetterOrder) -> DeadLetterCopy:
    row = order.delivery.row
    return DeadLetterCopy(message_id=published_id(row), offset=row.offset,
                          attempts=order.delivery.attempt, error=order.error,
                          reason=order.reason)
