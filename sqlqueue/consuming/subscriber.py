"""One subscription: a consumer group's view of one topic, across its partitions.

Runs on the runner's main thread and owns its database connection there. Each poll it
reads new rows of its partitions, hands deliverable ones to the handler pool, records
the outcomes that came back (in one statement per partition), and moves watermarks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import connections, transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue.conf import MAX_NAME_BYTES, QueueSettings
from sqlqueue.consuming.backoff import retry_delay
from sqlqueue.consuming.handlers import Delivery, Outcome, published_id
from sqlqueue.consuming.leases import LeaseKeeper
from sqlqueue.consuming.partition import Entry, PartitionState
from sqlqueue.consuming.registry import Consumer
from sqlqueue.storage.sql import Dialect, dialect_for
from sqlqueue.storage.sql.base import Settlement

logger = logging.getLogger("sqlqueue.consumer")

# While the log grows, partitions are looked for again after MIN_DISCOVERY_INTERVAL, or
# DISCOVERY_COST_FACTOR times what the last look took, whichever is longer: a new
# partition's first message waits about a poll, and a topic with many partitions spends
# at most 1/DISCOVERY_COST_FACTOR of its time looking.
MIN_DISCOVERY_INTERVAL = 0.1
DISCOVERY_COST_FACTOR = 20
DISCOVERY_IDLE_INTERVAL = 30.0  # ... and while it does not grow, now and then
SWEEP_INTERVAL = 2.0  # seconds between sweeps of a window for late-committed rows
SWEEP_LIMIT = 5000  # offsets read per sweep
WATERMARK_STEP = 0.5  # seconds between watermark writes of a partition, at most
_sequence = itertools.count()


def dead_letter_id(original_id: str, group: str) -> str:
    """The id of a group's dead letter: unique per (message id, group) in the dead-letter
    topic, so two groups can dead-letter the same message (SPEC I6)."""
    candidate = f"{original_id}@{group}"
    if len(candidate.encode("utf-8")) <= MAX_NAME_BYTES:
        return candidate
    return "sha256:" + hashlib.sha256(f"{original_id}\x00{group}".encode()).hexdigest()


class Subscriber:
    def __init__(self, consumer: Consumer, conf: QueueSettings, alias: str,
                 name: str = "subscriber") -> None:
        self.consumer = consumer
        self.options = consumer.options(conf)
        self.conf = conf
        self.alias = alias
        self.name = name
        self.leases = LeaseKeeper(consumer.group, consumer.topic, name, conf.LEASE_DURATION,
                                  conf.LEASE_RENEW_INTERVAL)
        self.discovered: list[str] = []
        self.partitions: dict[str, PartitionState] = {}  # the partitions this one holds
        self.outstanding: dict[int, Delivery] = {}  # handed to the pool, no outcome yet
        self.stats: Counter[str] = Counter()
        self._discovered_at_head = -1
        self._next_discovery = 0.0
        self._last_sweep: dict[str, float] = {}
        self._last_advance: dict[str, float] = {}

    @property
    def dialect(self) -> Dialect:
        return dialect_for(connections[self.alias])

    @property
    def group(self) -> str:
        return self.consumer.group

    @property
    def topic(self) -> str:
        return self.consumer.topic

    def reset(self) -> None:
        """Forget the in-memory view (after a lost connection); it is rebuilt from the
        database, where everything that matters is durable."""
        self.partitions.clear()
        self._discovered_at_head = -1
        self._next_discovery = 0.0
        self.leases.hurry()

    # -- partitions ---------------------------------------------------------------------
    def discover(self, cursor: CursorWrapper, head: Callable[[], int]) -> None:
        """Find the topic's partitions (a loose index scan); new ones are leased at the
        next lease tick, which comes at once when nobody holds them."""
        now = time.monotonic()
        if now < self._next_discovery:
            return
        # A new head may mean a new partition: look again soon (see
        # MIN_DISCOVERY_INTERVAL); with no new message anywhere, only now and then.
        if head() == self._discovered_at_head and now < (
            self._next_discovery + DISCOVERY_IDLE_INTERVAL
        ):
            return
        self.discovered = self.dialect.discover_partitions(cursor, self.topic)
        took = time.monotonic() - now
        held = set(self.leases.owned) | self.leases.others
        if any(key not in held for key in self.discovered):
            self.leases.hurry()
        self._discovered_at_head = head()
        self._next_discovery = now + max(MIN_DISCOVERY_INTERVAL, took * DISCOVERY_COST_FACTOR)

    def keep_leases(self, cursor: CursorWrapper) -> int:
        """The lease tick, when due: heartbeat, renew, rebalance; then start or stop
        working on the partitions gained or lost. Returns how many queued deliveries of
        partitions being handed over were taken back from the pool."""
        if not self.leases.due() and self.outstanding and self.leases.membership_check_due():
            # Busy: at most one cheap read a second (idle polls stay at one statement).
            self.leases.check_membership(cursor, self.dialect)
        if not self.leases.due():
            return 0
        idle = {key for key, state in self.partitions.items() if state.in_flight_count == 0}
        idle |= set(self.leases.owned) - set(self.partitions)
        self.leases.tick(cursor, self.dialect, self.discovered, idle)
        # Work exactly on the partitions held: new ones (and, after a reconnect, every
        # one) start from their durable watermark; lost ones are dropped.
        # A partition held again under a new generation (its lease was lost or revoked
        # by an operator's repair, then acquired again) starts afresh too.
        for key, state in list(self.partitions.items()):
            if state.generation != self.leases.generation(key):
                del self.partitions[key]
        for key in sorted(set(self.leases.owned) - set(self.partitions)):
            watermark = self.dialect.ensure_watermark(cursor, self.group, self.topic, key)
            self.partitions[key] = PartitionState(key, watermark,
                                                  generation=self.leases.generation(key))
        return self._take_back(cursor, self.leases.releasing)

    def _take_back(self, cursor: CursorWrapper, partitions: set[str]) -> int:
        """Give back the queued (not started) deliveries of partitions being handed over,
        so that they fall idle and can be released without waiting for the queue."""
        taken = [d for d in self.outstanding.values()
                 if d.partition_key in partitions and d.give_back()]
        if taken:
            with transaction.atomic(using=self.alias):
                self.fence(cursor)
                for delivery in taken:
                    del self.outstanding[id(delivery)]
                    if delivery.partition_key in self.partitions:
                        self.give_back(cursor, delivery)
            self.leases.hurry()
        return len(taken)

    def fence(self, cursor: CursorWrapper) -> None:
        """Inside the cycle's transaction: share-lock this (group, topic)'s leases and keep
        only the partitions still held with the same generation. Until the transaction
        ends nobody can take them over, so every write that follows is made as owner
        (fencing against a subscriber that was paused or cut off, SPEC I5)."""
        current = {p: (owner, generation, age)
                   for p, owner, generation, age in self.dialect.list_leases(
                       cursor, self.group, self.topic, lock=True)}
        # The same rows show partitions nobody holds (a lease released, as by a member
        # that stopped, has no row; one not renewed has expired): share them out now.
        if any(key not in current for key in self.discovered) or any(
                age >= self.leases.duration_ms for _, _, age in current.values()):
            self.leases.notice_free()
        for key in list(self.partitions):
            owner, generation, age = current.get(key, ("", -1, 0))
            if (owner != self.name or generation != self.leases.generation(key)
                    or age >= self.leases.duration_ms):
                logger.warning("%s lost the lease on %s/%s to %r; stopping work on it.",
                               self.name, self.topic, key, owner or "nobody")
                del self.partitions[key]
                self.leases.owned.pop(key, None)

    def has_work(self, outcomes: int, head: Callable[[], int], now_ms: int) -> bool:
        """Whether a cycle would write or read anything (if not, it costs no query)."""
        if outcomes:
            return True
        batch = self.options.batch_size
        for key, state in self.partitions.items():
            if state.window_open or state.wants_fetch(batch, head):
                return True
            if self.leases.holds(key) and state.ready(now_ms, batch, self.consumer.ordered):
                return True
        return False

    # -- delivering ---------------------------------------------------------------------
    def poll(
        self, cursor: CursorWrapper, now_ms: int, head: Callable[[], int], budget: int | None
    ) -> list[Delivery]:
        """Read what is new and return the deliveries to hand out now (marked delivered).

        ``budget`` caps the number of deliveries (``--max-messages``); None: no cap.
        """
        batch = self.options.batch_size
        chosen: list[tuple[PartitionState, Entry]] = []
        for key, state in self.partitions.items():
            if not self.leases.holds(key):
                continue  # being released, or the lease is too close to its end
            if state.wants_fetch(batch, head):
                rows = self.dialect.fetch_messages(
                    cursor, self.group, self.topic, state.partition_key, state.cursor, batch
                )
                state.absorb(rows, self.group)
                state.fetched(len(rows), batch, head, now_ms)
            ready = state.ready(now_ms, batch, self.consumer.ordered)
            if budget is not None:
                ready = ready[: max(0, budget - len(chosen))]
            chosen += [(state, entry) for entry in ready]
        return self._deliver(cursor, chosen, now_ms) if chosen else []

    def _deliver(
        self, cursor: CursorWrapper, chosen: list[tuple[PartitionState, Entry]], now_ms: int
    ) -> list[Delivery]:
        """Mark every chosen message delivered, all partitions in one statement."""
        invisible_until = now_ms + round(self.options.visibility_timeout * 1000)
        self.dialect.mark_delivered(cursor, self.group, self.topic, [
            (state.partition_key, entry.offset, invisible_until) for state, entry in chosen
        ])
        deliveries = []
        for state, entry in chosen:
            if entry.in_flight:
                logger.warning(
                    "%s/%s@%s: the handler of attempt %s outlived the visibility timeout "
                    "(%ss); delivering it again.", self.topic, state.partition_key,
                    entry.offset, entry.attempt, self.options.visibility_timeout)
            state.dispatched(entry, invisible_until)
            assert entry.row is not None
            delivery = Delivery(self.consumer, self.alias, state.partition_key, entry.row,
                                entry.attempt, next(_sequence),
                                lease_valid=self._lease_check(state.partition_key,
                                                              state.generation),
                                on_extend=self._hold(entry), generation=state.generation)
            if entry.attempt > self.options.max_attempts:
                # Attempts were charged but never reported (a worker died mid-handler, or
                # gave up past the visibility timeout): the retry budget is spent.
                self._dead_letter(cursor, state, delivery, "crashed", (
                    f"Gave up after {entry.attempt - 1} attempt(s) that never completed "
                    "(the worker stopped or the visibility timeout ran out)."
                ))
                continue
            deliveries.append(delivery)
            self.outstanding[id(delivery)] = delivery
        self.stats["delivered"] += len(deliveries)
        return deliveries

    @staticmethod
    def _hold(entry: Entry) -> Callable[[float], None]:
        """extend_visibility() also tells this process not to deliver it again yet."""
        def hold(seconds: float) -> None:
            entry.held_until = time.monotonic() + seconds

        return hold

    def _lease_check(self, partition: str, generation: int | None) -> Callable[[], bool]:
        def valid() -> bool:
            return (self.leases.holds(partition)
                    and self.leases.generation(partition) == generation)

        return valid

    # -- outcomes -----------------------------------------------------------------------
    def record(self, cursor: CursorWrapper, outcomes: Iterable[Outcome], now_ms: int) -> None:
        """Write what the handlers did: acks and retries of every partition in one
        statement, and one short transaction per dead letter."""
        settlements: list[Settlement] = []
        finished: list[Delivery] = []
        retries: list[tuple[Delivery, int]] = []
        for outcome in outcomes:
            delivery = outcome.delivery
            self.outstanding.pop(id(delivery), None)
            key, offset = delivery.partition_key, delivery.row.offset
            state = self.partitions.get(key)
            if state is None or state.generation != delivery.generation:
                # The lease went elsewhere (or came back under a new generation): the
                # owner redelivers this message once its visibility timeout is over (at
                # least once, never acked by a stranger).
                self.stats["abandoned"] += 1
                continue
            entry = self.partitions[key].entries.get(offset)
            if entry is not None and entry.attempt > delivery.attempt and outcome.kind != "ack":
                continue  # a late word from an attempt that was overtaken by a redelivery
            if outcome.kind == "not_started":
                self.give_back(cursor, delivery)
                continue
            if outcome.kind == "ack":
                settlements.append(Settlement(key, offset, acked=True, invisible_until=0))
                finished.append(delivery)
            elif outcome.kind == "acked":
                finished.append(delivery)  # an atomic handler wrote its ack already
            elif outcome.kind == "reject" or delivery.attempt >= self.options.max_attempts:
                reason = "rejected" if outcome.kind == "reject" else "max_attempts"
                self._dead_letter(cursor, self.partitions.get(key), delivery, reason,
                                  outcome.error)
            else:
                delay = outcome.delay
                if delay is None:
                    delay = retry_delay(delivery.attempt, self.options.min_backoff,
                                        self.options.max_backoff)
                due = now_ms + round(1000 * delay)
                settlements.append(Settlement(key, offset, acked=False, invisible_until=due,
                                              last_error=outcome.error))
                retries.append((delivery, due))
        self.dialect.settle(cursor, self.group, self.topic, settlements)
        self.stats["acked"] += len(finished)
        self.stats["retried"] += len(retries)
        for delivery in finished:
            state = self.partitions.get(delivery.partition_key)
            if state is not None:
                state.finished(delivery.row.offset)
        for delivery, due in retries:
            state = self.partitions.get(delivery.partition_key)
            if state is not None:
                state.retry_at(delivery.row.offset, due)

    def _dead_letter(
        self, cursor: CursorWrapper, state: PartitionState | None, delivery: Delivery,
        reason: str, error: str,
    ) -> None:
        row = delivery.row
        message_id = published_id(row)
        detail = json.dumps({"id": message_id, "offset": row.offset, "group": self.group,
                             "reason": reason})
        with transaction.atomic(using=self.alias):
            self.dialect.insert_dead_letter(
                cursor,
                dead_letter_topic=self.topic + self.conf.DLQ_SUFFIX,
                dead_letter_id=dead_letter_id(message_id, self.group),
                offset=row.offset, attempts=delivery.attempt, last_error=error,
                detail=detail, group=self.group,
            )
            self.dialect.settle(cursor, self.group, self.topic, [
                Settlement(delivery.partition_key, row.offset, acked=True, invisible_until=0)
            ])
        logger.error("Dead-lettered %s/%s@%s for group %r after %s attempt(s) (%s).",
                     self.topic, delivery.partition_key, row.offset, self.group,
                     delivery.attempt, reason)
        self.stats["dead_lettered"] += 1
        if state is not None:
            state.finished(row.offset)

    def give_back(self, cursor: CursorWrapper, delivery: Delivery) -> None:
        """A delivery no handler started: undo its attempt (graceful shutdown)."""
        state = self.partitions.get(delivery.partition_key)
        entry = state.entries.get(delivery.row.offset) if state else None
        # The attempt before this delivery: none at all for a first delivery.
        previous = entry.previous_retry_count if entry else (
            None if delivery.attempt == 1 else delivery.attempt - 2
        )
        self.dialect.give_back(cursor, self.group, self.topic, delivery.partition_key,
                               delivery.row.offset, previous)
        if state is not None:
            state.given_back(delivery.row.offset)

    # -- watermarks ---------------------------------------------------------------------
    def advance(
        self, cursor: CursorWrapper, settled_before: int | None, force: bool = False
    ) -> None:
        """Move each partition's watermark over settled, done rows (created before
        ``settled_before``; None: all are), after checking the window for late-committed
        rows; then drop the delivery state it covers."""
        now = time.monotonic()
        for key, state in self.partitions.items():
            if not state.window_open:
                continue  # idle and settled: nothing to check, no query
            candidate = state.advance_candidate(settled_before)
            sweep_due = force or now - self._last_sweep.get(key, 0.0) >= SWEEP_INTERVAL
            if candidate <= state.watermark and not sweep_due:
                continue
            recently = now - self._last_advance.get(key, 0.0) < WATERMARK_STEP
            if candidate > state.watermark and recently and not sweep_due:
                continue  # batch watermark writes: at most one per partition per step
            candidate = self._sweep(cursor, state, candidate, settled_before)
            self._last_sweep[key] = now
            if candidate > state.watermark:
                self.dialect.advance_watermark(cursor, self.group, self.topic, key, candidate)
                # Only now that the watermark is durable may the state behind it go
                # (or, with KEEP_DELIVERY_STATE, with its message, at garbage collection).
                if not self.conf.KEEP_DELIVERY_STATE:
                    self.dialect.delete_states_upto(cursor, self.group, self.topic, key,
                                                    candidate)
                state.moved_watermark(candidate)
                self._last_advance[key] = now

    def _sweep(
        self, cursor: CursorWrapper, state: PartitionState, candidate: int,
        settled_before: int | None,
    ) -> int:
        """Look for rows in the window that were committed after the fetch passed them."""
        upto = max(candidate, state.covered)
        stored = self.dialect.list_offsets(
            cursor, self.topic, state.partition_key, state.watermark, upto, SWEEP_LIMIT
        )
        unknown = [o for o in stored if o not in state.entries]
        if unknown:
            rows = self.dialect.fetch_messages_at(
                cursor, self.group, self.topic, state.partition_key, unknown
            )
            for entry in state.absorb(rows, self.group):
                logger.info("Found late-committed message %s/%s@%s for group %r.",
                            self.topic, state.partition_key, entry.offset, self.group)
            candidate = state.advance_candidate(settled_before)
        if len(stored) == SWEEP_LIMIT:
            candidate = min(candidate, stored[-1])  # only checked up to there
        return candidate

    # -- status -------------------------------------------------------------------------
    def busy(self, now_ms: int) -> bool:
        return any(state.busy(now_ms) for state in self.partitions.values())

    def caught_up(self, head: Callable[[], int]) -> bool:
        """Every partition is held by a live subscriber, and this one read each of its
        own to the end at the current head."""
        held = set(self.partitions) | self.leases.others
        return (self._discovered_at_head == head()
                and all(key in held for key in self.discovered)
                and all(state.exhausted and state.covered >= head()
                        for state in self.partitions.values()))

    def stop(self, cursor: CursorWrapper) -> None:
        """Graceful stop: hand every partition over and deregister."""
        self.leases.release_all(cursor, self.dialect)
        self.partitions.clear()

    def next_due_ms(self) -> int | None:
        dues = [d for d in (s.next_due_ms() for s in self.partitions.values()) if d is not None]
        return min(dues) if dues else None
