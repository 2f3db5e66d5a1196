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
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue import events
from sqlqueue.conf import MAX_NAME_BYTES, QueueSettings
from sqlqueue.consuming.backoff import retry_delay
from sqlqueue.consuming.handlers import Delivery, Outcome, published_id
from sqlqueue.consuming.leases import LeaseKeeper
from sqlqueue.consuming.limits import Limits
from sqlqueue.consuming.partition import Entry, PartitionState
from sqlqueue.consuming.registry import Consumer
from sqlqueue.storage.sql import Dialect, dialect_for
from sqlqueue.storage.sql.base import OutcomeWrite

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
#: A write stamped with a time (visibility, backoff) that took longer than this waited for
#: a lock: its time is stamped again from a fresh reading of the clock.
RESTAMP_AFTER_MS = 250
_sequence = itertools.count()


@dataclass(frozen=True)
class _Retry:
    """A handler asked for (or earned) another attempt after ``delay_ms``."""

    delivery: Delivery
    delay_ms: int
    error: str

    def outcome_write(self, now_ms: int) -> OutcomeWrite:
        return OutcomeWrite(self.delivery.partition_key, self.delivery.row.offset, acked=False,
                          invisible_until=now_ms + self.delay_ms, last_error=self.error)


def dead_letter_id(original_id: str, group: str) -> str:
    """The id of a group's dead letter: unique per (message id, group) in the dead-letter
    topic, so two groups can dead-letter the same message (SPEC I6)."""
    candidate = f"{original_id}@{group}"
    if len(candidate.encode("utf-8")) <= MAX_NAME_BYTES:
        return candidate
    return "sha256:" + hashlib.sha256(f"{original_id}\x00{group}".encode()).hexdigest()


class Subscriber:
    def __init__(self, consumer: Consumer, conf: QueueSettings, alias: str,
                 name: str = "subscriber", *, clock: Callable[[], int]) -> None:
        self.consumer = consumer
        # The database clock (epoch ms), read at each decision rather than once a cycle: a
        # statement can wait seconds for a lock, and a reading from before the wait would
        # stamp visibility, backoff and covered_at_ms that far in the past (SPEC I4, I10).
        self.clock = clock
        self.options = consumer.options(conf)
        self.conf = conf
        self.alias = alias
        self.name = name
        self.leases = LeaseKeeper(consumer.group, consumer.topic, name, conf.LEASE_DURATION,
                                  conf.LEASE_RENEW_INTERVAL)
        self.discovered: list[str] = []
        self.partitions: dict[str, PartitionState] = {}  # the partitions this one holds
        self.outstanding: dict[int, Delivery] = {}  # handed to the pool, no outcome yet
        # Timed out (counted as failed) while their handler thread still runs: under
        # max_in_flight they still occupy a place.
        self.stuck: list[Delivery] = []
        self.limits = None if consumer.rate_limit is None and consumer.max_in_flight is None \
            else Limits(consumer.rate_limit, consumer.max_in_flight,
                        warm_up=conf.LEASE_RENEW_INTERVAL)
        # Told which server each fenced transaction ran on (the runner raises if another).
        self.check_server: Callable[[str], None] = lambda server: None
        self.stats: Counter[str] = Counter()
        self._discovered_at_head = -1
        self._next_discovery = 0.0
        self._last_sweep: dict[str, float] = {}
        self._last_advance: dict[str, float] = {}
        # The highest watermark of each partition this process has read or written: a
        # lower one later is worth an ERROR (_check_not_back).
        self._seen_watermarks: dict[str, int] = {}

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

    def forget_server(self) -> None:
        """The connection reached another server (a failover, a proxy that moved it):
        nothing learnt on the old one holds there, not even the leases, and no outcome of
        a delivery made there may be recorded (its offset may name another message on
        this server: after an asynchronous failover the new primary hands out again the
        offsets the old one had used)."""
        self.reset()
        self.outstanding.clear()
        self.leases.forget()
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

    def keep_leases(self, cursor: CursorWrapper) -> list[Delivery]:
        """The lease tick, when due: heartbeat, renew, rebalance; then start or stop
        working on the partitions gained or lost. Returns the queued deliveries of
        partitions being handed over that were taken back from the pool."""
        if not self.leases.due() and self.outstanding and self.leases.membership_check_due():
            # Busy: at most one cheap read a second (idle polls stay at one statement).
            self.leases.check_membership(cursor, self.dialect, self.discovered)
        if not self.leases.due():
            return []
        idle = {key for key, state in self.partitions.items() if state.in_flight_count == 0}
        idle |= set(self.leases.owned) - set(self.partitions)
        self.leases.tick(cursor, self.dialect, self.discovered, idle,
                         may_release=self._within_in_flight_share)
        # Work exactly on the partitions held: new ones (and, after a reconnect, every
        # one) start from their durable watermark; lost ones are dropped.
        # A partition held again under a new generation (its lease was lost or revoked
        # by an operator's repair, then acquired again) starts afresh too.
        for key, state in list(self.partitions.items()):
            if state.generation != self.leases.generation(key):
                del self.partitions[key]
        for key in sorted(set(self.leases.owned) - set(self.partitions)):
            watermark = self.dialect.ensure_watermark(cursor, self.group, self.topic, key)
            self._check_not_back(key, watermark)
            self.partitions[key] = PartitionState(key, watermark,
                                                  generation=self.leases.generation(key))
        return self._take_back(self.leases.releasing)

    def _check_not_back(self, key: str, watermark: int) -> None:
        """A watermark only moves forward, but for an operator's reset-position or writes
        the database lost (a failover to a replica that was behind, a restore): say so,
        as the messages in between are delivered again."""
        seen = self._seen_watermarks.get(key, 0)
        if watermark < seen:
            logger.error(
                "The watermark of %s on %s/%s went back from %d to %d: an operator reset it "
                "(queue reset-position), or the database lost writes (a failover to a "
                "replica that was behind, a restore). Messages in between are delivered "
                "again.", self.group, self.topic, key, seen, watermark,
                extra=events.fields(events.WATERMARK_WENT_BACK, group=self.group,
                                    topic=self.topic, partition=key, seen=seen,
                                    now=watermark))
        self._seen_watermarks[key] = watermark

    def _take_back(self, partitions: set[str]) -> list[Delivery]:
        """Take back the queued (not started) deliveries of partitions being handed over,
        so that they fall idle and can be released without waiting for the queue. No
        handler will start them: the caller records them as not started (given back, no
        attempt charged) with the other outcomes, whose writes are retried until they
        succeed. (Written here, a failed write was forgotten while the runner still
        counted them in flight: a --max-messages worker then waited for them forever,
        holding its partitions.)"""
        taken = [d for d in self.outstanding.values()
                 if d.partition_key in partitions and d.give_back()]
        if taken:
            self.leases.hurry()
        return taken

    def fence(self, cursor: CursorWrapper) -> None:
        """Inside the cycle's transaction: share-lock this (group, topic)'s leases and keep
        only the partitions still held with the same generation. Until the transaction
        ends nobody can take them over, so every write that follows is made as owner
        (fencing against a subscriber that was paused or cut off, SPEC I5)."""
        if not self.partitions:
            return
        # Only this subscriber's own lease rows (primary-key lookups): a peer paused inside
        # its own cycle transaction then blocks nobody's renewal, and nobody blocks ours.
        rows, server = self.dialect.fence_leases(cursor, self.group, self.topic,
                                                 sorted(self.partitions))
        if server is not None:
            self.check_server(server)  # before anything is written as owner
        current = {p: (owner, generation, age) for p, owner, generation, age in rows}
        for key in list(self.partitions):
            owner, generation, age = current.get(key, ("", -1, 0))
            if (owner != self.name or generation != self.leases.generation(key)
                    or age >= self.leases.duration_ms):
                logger.warning("%s lost the lease on %s/%s to %r; stopping work on it.",
                               self.name, self.topic, key, owner or "nobody")
                del self.partitions[key]
                self.leases.owned.pop(key, None)

    def has_work(self, outcomes: int, head: Callable[[], int]) -> bool:
        """Whether a cycle would write or read anything (if not, it costs no query)."""
        if outcomes:
            return True
        batch = self.options.batch_size
        now_ms = self.clock()
        may_start = self.allowance() != 0
        for key, state in self.partitions.items():
            if state.window_open or state.wants_fetch(batch, head):
                return True
            if (may_start and self.leases.holds(key)
                    and state.ready(now_ms, batch, self.consumer.ordered)):
                return True
        return False

    # -- limits (rate_limit, max_in_flight) ---------------------------------------------
    def in_flight(self) -> int:
        """Deliveries outstanding, and timed-out handlers still running."""
        self.stuck = [d for d in self.stuck if d.running]
        return len(self.outstanding) + sum(1 for d in self.stuck
                                           if id(d) not in self.outstanding)

    def allowance(self) -> int | None:
        """How many messages the consumer's limits let start now (None: no limit)."""
        if self.limits is None:
            return None
        partitions = set(self.discovered) | set(self.leases.owned) | self.leases.others
        held = len(set(self.leases.owned) - self.leases.releasing)
        self.limits.share_leases(held, len(partitions))
        return self.limits.allowance(self.in_flight(), self.leases.members, self.name)

    def _within_in_flight_share(self) -> bool:
        """Partitions are handed over to a newcomer only once this process is within its
        new, smaller max_in_flight share: the newcomer's share is then really free."""
        if self.limits is None:
            return True
        share = self.limits.in_flight_share(self.leases.members, self.name)
        return share is None or self.in_flight() <= share

    # -- delivering ---------------------------------------------------------------------
    def poll(
        self, cursor: CursorWrapper, head: Callable[[], int], budget: int | None
    ) -> list[Delivery]:
        """Read what is new and return the deliveries to hand out now (marked delivered).

        ``budget`` caps the number of deliveries (``--max-messages``); None: no cap. The
        consumer's limits cap it too: what they hold back is not marked delivered (no
        attempt charged), and waits in the buffer.
        """
        allowance = self.allowance()
        if allowance is not None:
            budget = allowance if budget is None else min(budget, allowance)
        batch = self.options.batch_size
        held = [state for key, state in self.partitions.items()
                if self.leases.holds(key)]  # not those being released or near their end
        self._fetch(cursor, [s for s in held if s.wants_fetch(batch, head)], head)
        chosen: list[tuple[PartitionState, Entry]] = []
        for state in held:
            ready = state.ready(self.clock(), batch, self.consumer.ordered)
            if budget is not None:
                ready = ready[: max(0, budget - len(chosen))]
            chosen += [(state, entry) for entry in ready]
        if not chosen:
            return []
        if self.limits is not None:
            self.limits.spend(len(chosen))
        return self._deliver(cursor, chosen)

    def _fetch(self, cursor: CursorWrapper, wanted: list[PartitionState],
               head: Callable[[], int]) -> None:
        """Read the next rows of every partition in ``wanted``, in one statement."""
        if not wanted:
            return
        batch = self.options.batch_size
        found = self.dialect.fetch_partitions(
            cursor, self.group, self.topic,
            [(state.partition_key, state.cursor) for state in wanted], batch)
        # The head first, the clock after it: covered_at_ms must not be earlier than the
        # read that found the head, or a later write horizon could close the window over
        # a publisher still open (SPEC I4).
        head()
        now_ms = self.clock()
        for state in wanted:
            rows = found[state.partition_key]
            state.absorb(rows, self.group)
            state.fetched(len(rows), batch, head, now_ms)

    def _deliver(
        self, cursor: CursorWrapper, chosen: list[tuple[PartitionState, Entry]]
    ) -> list[Delivery]:
        """Mark every chosen message delivered, all partitions in one statement.

        Returned deliveries are not yet ``outstanding``: the caller hands them out (and
        calls ``handed_out``) only once the transaction that marked them has committed."""
        invisible_until = self._mark_delivered(cursor, chosen)
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
        return deliveries

    def _mark_delivered(
        self, cursor: CursorWrapper, chosen: list[tuple[PartitionState, Entry]]
    ) -> int:
        """Start the visibility timeouts; returns when they end in this process's view.

        If the statement waited for a lock, the time it stamped is already partly spent:
        the rows are stamped again (with the locks now held, at once), so that no other
        owner redelivers early and no ordered run overlaps the one starting now (I5, I10).
        """
        timeout_ms = round(self.options.visibility_timeout * 1000)
        stamped_at = self.clock()
        self.dialect.mark_delivered(cursor, self.group, self.topic, [
            (state.partition_key, entry.offset, stamped_at + timeout_ms)
            for state, entry in chosen
        ])
        now = self.clock()
        if now - stamped_at > RESTAMP_AFTER_MS:
            logger.warning("%s/%s: marking %s message(s) delivered waited %.1fs; stamping "
                           "their visibility timeout again.", self.group, self.topic,
                           len(chosen), (now - stamped_at) / 1000)
            for state, entry in chosen:
                self.dialect.extend_visibility(cursor, self.group, self.topic,
                                               state.partition_key, entry.offset, timeout_ms)
            now = self.clock()
        return now + timeout_ms

    def handed_out(self, deliveries: Iterable[Delivery]) -> None:
        """The transaction that marked ``deliveries`` committed: they are the handlers'."""
        count = 0
        for delivery in deliveries:
            self.outstanding[id(delivery)] = delivery
            count += 1
        self.stats["delivered"] += count

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
    def record(self, cursor: CursorWrapper, outcomes: Iterable[Outcome]) -> None:
        """Write what the handlers did: acks and retries of every partition in one
        statement, and one short transaction per dead letter."""
        acks: list[OutcomeWrite] = []
        finished: list[Delivery] = []
        retries: list[_Retry] = []
        for outcome in outcomes:
            delivery = outcome.delivery
            # Looked up, not removed: until the caller's transaction commits (and calls
            # ``recorded``), a failed write is retried as the owner's, not dropped as
            # a stranger's (the ack would be lost, the message run again).
            if id(delivery) not in self.outstanding:
                # Made on a server this subscriber no longer talks to (forget_server).
                self.stats["abandoned"] += 1
                continue
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
                acks.append(OutcomeWrite(key, offset, acked=True, invisible_until=0))
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
                retries.append(_Retry(delivery, round(1000 * delay), outcome.error))
        stamped_at = self._write_outcomes(cursor, acks, retries)
        self.stats["acked"] += len(finished)
        self.stats["retried"] += len(retries)
        for delivery in finished:
            state = self.partitions.get(delivery.partition_key)
            if state is not None:
                state.finished(delivery.row.offset)
        for retry in retries:
            state = self.partitions.get(retry.delivery.partition_key)
            if state is not None:
                state.retry_at(retry.delivery.row.offset, stamped_at + retry.delay_ms)

    def recorded(self, outcomes: Iterable[Outcome]) -> None:
        """The transaction that recorded ``outcomes`` committed: they are settled."""
        for outcome in outcomes:
            self.outstanding.pop(id(outcome.delivery), None)

    def _write_outcomes(self, cursor: CursorWrapper, acks: list[OutcomeWrite],
                retries: list[_Retry]) -> int:
        """Acks and retries in one statement; returns the time the backoffs start from.
        If the statement waited for a lock, the backoffs are stamped again from a fresh
        reading (the locks are held by now), so that no wait cuts one short (SPEC I9)."""
        stamped_at = self.clock()
        self.dialect.write_outcomes(cursor, self.group, self.topic,
                            acks + [r.outcome_write(stamped_at) for r in retries])
        now = self.clock()
        if retries and now - stamped_at > RESTAMP_AFTER_MS:
            self.dialect.write_outcomes(cursor, self.group, self.topic,
                                [r.outcome_write(now) for r in retries])
            stamped_at = now
        return stamped_at

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
            self.dialect.write_outcomes(cursor, self.group, self.topic, [
                OutcomeWrite(delivery.partition_key, row.offset, acked=True, invisible_until=0)
            ])
        logger.error("Dead-lettered %s/%s@%s for group %r after %s attempt(s) (%s).",
                     self.topic, delivery.partition_key, row.offset, self.group,
                     delivery.attempt, reason,
                     extra=events.fields(events.MESSAGE_DEAD_LETTERED, group=self.group,
                                         topic=self.topic, partition=delivery.partition_key,
                                         offset=row.offset, attempt=delivery.attempt,
                                         reason=reason))
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
                first_open = state.first_open()
                self.dialect.advance_watermark(
                    cursor, self.group, self.topic, key, candidate,
                    first_open if first_open is not None and first_open > candidate else None)
                # Only now that the watermark is durable may the state behind it go
                # (or, with KEEP_DELIVERY_STATE, with its message, at garbage collection).
                if not self.conf.KEEP_DELIVERY_STATE:
                    self.dialect.delete_states_upto(cursor, self.group, self.topic, key,
                                                    candidate)
                state.moved_watermark(candidate)
                self._seen_watermarks[key] = candidate
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
    def busy(self) -> bool:
        now_ms = self.clock()
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
        if not dues:
            return None
        if self.limits is not None and self.allowance() == 0:
            # Held back by a limit: the rate limit's next token, or (max_in_flight) the
            # outcome that frees a place, which wakes the loop by itself.
            wait = self.limits.rate_wait()
            if not wait:
                return None
            return max(min(dues), self.clock() + math.ceil(wait * 1000))
        return min(dues)
