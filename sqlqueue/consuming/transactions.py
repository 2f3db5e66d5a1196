"""A subscription's short transactions on the runner's main thread, each fenced first
(its leases share-locked: every write that follows is made by the partitions' current
owner, guarantee I5): the pass's (record, fetch and mark, move watermarks) and one that
only records outcomes (paused, stopping, the exit). ``Runner`` owns one
``FencedTransactions``; the parts it uses (its ServerWatch, HorizonWatch, clock and
HandlerPool) are passed in.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import Error as AnyDatabaseError

from sqlqueue import storage
from sqlqueue.consuming.clock import Clock
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.handoff import HandlerPool
from sqlqueue.consuming.logholding import atomic_then_logs
from sqlqueue.consuming.server import Head, ServerWatch
from sqlqueue.consuming.settling import HorizonWatch
from sqlqueue.consuming.subscriber import Subscriber

logger = logging.getLogger("sqlqueue.consumer")


class FencedTransactions:
    """The runner's transactions for one subscription at a time."""

    def __init__(self, *, alias: str, name: str, server: ServerWatch, horizon: HorizonWatch,
                 clock: Clock, pool: HandlerPool) -> None:
        self.alias = alias
        self.name = name  # the runner's
        self.server = server
        self.horizon = horizon
        self.clock = clock
        self.pool = pool  # keeps the outcomes whose transaction did not commit

    def deliver(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome],
                head: Head, budget: int | None) -> list[Delivery]:
        """One short transaction for one subscription: its leases are share-locked first,
        so every write below is made by the partitions' current owner. Returns the
        deliveries marked (committed). If a lock wait gives up, nothing of it happened:
        its outcomes are recorded at the next pass and its state is read again."""
        try:
            with atomic_then_logs(self.alias, self.server.note_error):  # logs: after it
                subscriber.fence(cursor)
                # The clock is read only now, after the fence's lock wait (however long):
                # every time this transaction stamps comes from after it (guarantee I4, I10).
                settled = self.horizon.settled_before(cursor, self.clock.now_ms())
                # A batch consumer's acks: covered by its partitions' watermarks, moved
                # now, in this transaction (not written a row each); the rest written.
                # Both before the poll, which may read their rows (after a reset).
                deferred = subscriber.recorder.record(
                    cursor, outcomes, defer_acks=subscriber.defers_acks)
                if deferred and (unwritten := subscriber.watermarks.cover(
                        cursor, settled, deferred)):
                    subscriber.recorder.write_acks(cursor, unwritten)
                deliveries = subscriber.poll(cursor, head, budget)
                # Fewer watermarks while messages wait for this commit (quiet passes: more).
                subscriber.watermarks.advance(cursor, settled, delivering=bool(deliveries))
            subscriber.recorder.committed(outcomes)
            return deliveries
        except AnyDatabaseError as exc:
            self.pool.keep_unrecorded(outcomes)
            if not storage.store(self.alias).is_lock_wait(exc):
                raise
            logger.warning("%s on %s/%s: gave up a lock wait (%s); trying again at the next "
                           "pass.", self.name, subscriber.consumer.group,
                           subscriber.consumer.topic, exc)
            subscriber.reset()
            return []

    def record(self, subscriber: Subscriber, cursor: Any, outcomes: list[Outcome]) -> None:
        """Write outcomes as the partitions' owner (fenced), in one transaction."""
        if outcomes:
            try:
                with atomic_then_logs(self.alias, self.server.note_error):
                    subscriber.fence(cursor)
                    subscriber.recorder.record(cursor, outcomes)
                subscriber.recorder.committed(outcomes)
            except AnyDatabaseError:
                self.pool.keep_unrecorded(outcomes)
                raise
