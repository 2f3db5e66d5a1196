"""A subscription's outcome recording: the ``OutcomeRecorder``.

What the handlers did is written inside the pass's fenced transaction: ``recording.plan``
decides (a give-back, a dead letter, an ack or a retry), ``outcomes`` writes, and the
partitions' windows follow; once the transaction commits, ``recorded`` settles the
deliveries in the ``Deliveries`` ledger. Its ``Subscriber`` owns one; it is the one
writer of the subscription's counts (``stats``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue import events, storage
from sqlqueue.consuming import recording
from sqlqueue.consuming.delivering import RESTAMP_AFTER_MS
from sqlqueue.consuming.handlers import Delivery, Outcome, published_id, subject_of
from sqlqueue.consuming.ledger import Deliveries
from sqlqueue.consuming.outcomes import Ack, copy_to_dead_letters, give_back, write_acks
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import Consumer, ConsumerOptions

logger = logging.getLogger("sqlqueue.consumer")


class OutcomeRecorder:
    """Writes one subscription's outcomes, as the partitions' owner."""

    def __init__(self, *, consumer: Consumer, options: ConsumerOptions, alias: str,
                 dead_letter_topic: str, clock: Callable[[], int],
                 partitions: dict[str, PartitionState], deliveries: Deliveries) -> None:
        self.group, self.topic = consumer.group, consumer.topic
        self.options = options
        self.alias = alias
        self.dead_letter_topic = dead_letter_topic
        self.clock = clock  # the database clock (epoch ms)
        self.partitions = partitions  # the Subscriber's (it adds and drops them)
        self.deliveries = deliveries  # the Subscriber's ledger
        #: delivered, acked, retried, dead_lettered, abandoned (``Subscriber.stats``)
        self.stats: Counter[str] = Counter()

    def delivered(self, count: int) -> None:
        self.stats["delivered"] += count

    def record(self, cursor: CursorWrapper, outcomes: Iterable[Outcome]) -> None:
        """Write what the handlers did: ``recording.plan`` decides, ``write`` writes.
        Deliveries stay outstanding until the caller's transaction commits (and calls
        ``recorded``): a failed write is retried as the owner's, not dropped as a
        stranger's (the ack would be lost, the message run again). Nothing to record
        reads nothing (not even the clock)."""
        outcomes = list(outcomes)
        if not outcomes:
            return
        self.write(cursor, recording.plan(outcomes, outstanding=self.deliveries.outstanding,
                                          partitions=self.partitions, options=self.options,
                                          now_ms=self.clock()))

    def write(self, cursor: CursorWrapper, plan: recording.Plan) -> None:
        """Give-backs, then one short transaction per dead letter, then the acks and
        retries of every partition in one statement; then the in-memory view follows."""
        self.stats["abandoned"] += plan.abandoned
        store = storage.store(self.alias)
        for give in plan.give_backs:
            delivery = give.delivery
            give_back(cursor, store, self.group, self.topic,
                      delivery.partition_key, delivery.row.offset, give.previous_retry_count)
            self.partitions[delivery.partition_key].given_back(delivery.row.offset)
        for dead in plan.dead_letters:
            self.dead_letter(cursor, dead.delivery, dead.reason, dead.error)
        retries = self._write_acks_and_retries(cursor, plan.ack_writes(), plan.retries)
        self.stats["acked"] += len(plan.finished)
        self.stats["retried"] += len(retries)
        for delivery in plan.finished:
            self.partitions[delivery.partition_key].finished(delivery.row.offset,
                                                             delivery.attempt)
        for retry in retries:
            self.partitions[retry.delivery.partition_key].retry_at(
                retry.delivery.row.offset, retry.invisible_until)

    def recorded(self, outcomes: Iterable[Outcome]) -> None:
        """The transaction that wrote ``outcomes`` committed: their deliveries leave the
        ledger, and their runs end in the windows."""
        outcomes = list(outcomes)
        self.deliveries.answered(outcomes)
        for outcome in outcomes:
            delivery = outcome.delivery
            if (state := self.partitions.get(delivery.partition_key)) is not None:
                state.run_ended(delivery.row.offset, delivery.attempt)

    def _write_acks_and_retries(
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

    def dead_letter(self, cursor: CursorWrapper, delivery: Delivery, reason: str,
                    error: str) -> None:
        """Copy ``delivery``'s message to the dead letters and ack it, in a transaction
        of its own (a savepoint inside the pass's)."""
        row = delivery.row
        store = storage.store(self.alias)
        with transaction.atomic(using=self.alias):
            copy_to_dead_letters(
                cursor, store, dead_letter_topic=self.dead_letter_topic,
                group=self.group, message_id=published_id(row), offset=row.offset,
                attempts=delivery.attempt, error=error, reason=reason)
            write_acks(cursor, store, self.group, self.topic,
                       [Ack(delivery.partition_key, row.offset)])
        subject = subject_of(delivery)
        logger.error("Dead-lettered %s/%s@%s%s for group %r after %s attempt(s) (%s).",
                     self.topic, delivery.partition_key, row.offset,
                     f" ({subject})" if subject else "", self.group, delivery.attempt, reason,
                     extra=events.fields(events.MESSAGE_DEAD_LETTERED, group=self.group,
                                         topic=self.topic, partition=delivery.partition_key,
                                         offset=row.offset, attempt=delivery.attempt,
                                         reason=reason, subject=subject))
        self.stats["dead_lettered"] += 1
        if (state := self.partitions.get(delivery.partition_key)) is not None:
            state.finished(row.offset)
