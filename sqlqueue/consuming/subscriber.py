"""One subscription: a consumer group's view of one topic, across its partitions.

Runs on the runner's main thread and owns its database connection there. It owns the
partitions it holds and the deliveries in flight, and parts that work on them: a
``PartitionFinder`` (discovery), its ``LeaseKeeper``, a ``Fetcher`` (reads new rows,
marks the deliverable ones delivered for the handler pool), a ``WatermarkKeeper``; here:
the fence, its limits, and recording (``recording`` decides what to write, ``outcomes``
writes it).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue import events
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming import recording
from sqlqueue.consuming.delivering import RESTAMP_AFTER_MS, Fetcher, HeldView
from sqlqueue.consuming.discovery import PartitionFinder
from sqlqueue.consuming.earlier_runs import EarlierRuns
from sqlqueue.consuming.handlers import Delivery, Outcome, published_id, subject_of
from sqlqueue.consuming.leases import LeaseKeeper
from sqlqueue.consuming.limits import Limits
from sqlqueue.consuming.outcomes import Ack, copy_to_dead_letters, give_back, write_acks
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import Consumer
from sqlqueue.consuming.watermarks import WatermarkKeeper
from sqlqueue.storage import store
from sqlqueue.storage.sql import Dialect

logger = logging.getLogger("sqlqueue.consumer")


class Subscriber:
    def __init__(self, consumer: Consumer, conf: QueueSettings, alias: str,
                 name: str = "subscriber", *, clock: Callable[[], int],
                 hold_clock: Callable[[], int] | None = None,
                 check_server: Callable[[str], None] = lambda server: None,
                 watch_when_idle: bool = False) -> None:
        self.consumer = consumer
        # The database clock (epoch ms), read at each decision rather than once a cycle: a
        # statement can wait seconds for a lock, and a reading from before the wait would
        # stamp visibility, backoff and covered_at_ms that far in the past (guarantee I4, I10).
        self.clock = clock
        # The same clock read on handler threads (extend_visibility): never a query.
        self.hold_clock = hold_clock or clock
        self.options = consumer.options(conf)
        self.conf = conf
        self.alias = alias
        self.name = name
        self.leases = LeaseKeeper(consumer.group, consumer.topic, name, conf.LEASE_DURATION,
                                  conf.LEASE_RENEW_INTERVAL)
        self.partitions: dict[str, PartitionState] = {}  # the partitions this one holds
        self.outstanding: dict[int, Delivery] = {}  # handed to the pool, no outcome yet
        self.stuck: list[Delivery] = []  # timed out, handler still running: in flight
        self.earlier_runs = EarlierRuns(consumer.group, consumer.topic, clock)  # ordered
        self.limits = None if consumer.rate_limit is None and consumer.max_in_flight is None \
            else Limits(consumer.rate_limit, consumer.max_in_flight,
                        warm_up=conf.LEASE_RENEW_INTERVAL)
        self.check_server = check_server  # raises if a fenced pass ran on another server
        self.stats: Counter[str] = Counter()
        # --until-empty: idle, it watches the membership too (WATCH_RECHECK) to take
        # over at once what a member that finished released, not at its next renewal.
        self.watch_when_idle = watch_when_idle
        self.finder = PartitionFinder(group=consumer.group, topic=consumer.topic,
                                      alias=alias, leases=self.leases,
                                      start_latest=consumer.start == "latest")
        self.fetcher = Fetcher(consumer=consumer, options=self.options, alias=alias,
                               clock=clock, leases=self.leases, limits=self.limits,
                               partitions=self.partitions, outstanding=self.outstanding,
                               view=HeldView(self.leases, self.partitions, self.hold_clock))
        self.watermarks = WatermarkKeeper(group=consumer.group, topic=consumer.topic,
                                          alias=alias, partitions=self.partitions,
                                          keep_delivery_state=conf.KEEP_DELIVERY_STATE)

    @property
    def dialect(self) -> Dialect:
        return store(self.alias)

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
        self.finder.reset()
        self.leases.hurry()

    def forget_server(self) -> None:
        """Another server (a failover, a moved proxy): nothing learnt on the old one holds,
        not the leases, nor a delivery's outcome (after an asynchronous failover the new
        primary hands out the old one's offsets again: another message)."""
        self.reset()
        self.outstanding.clear()
        self.leases.forget()
        self.earlier_runs.forget()
    # -- partitions ---------------------------------------------------------------------
    @property
    def discovered(self) -> list[str]:
        return self.finder.discovered

    def discover(self, cursor: CursorWrapper, head: Callable[[], int]) -> None:
        self.finder.discover(cursor, head, busy=bool(self.outstanding))

    def look_again_now(self) -> None:
        self.finder.look_again_now()

    def keep_leases(self, cursor: CursorWrapper,
                    head: Callable[[], int] | None = None) -> list[Delivery]:
        """The lease tick, when due: heartbeat, renew, rebalance; then start or stop
        working on the partitions gained or lost. Returns the queued deliveries of
        partitions being handed over that were taken back from the pool. ``head``: the
        log's head, read when needed (an idle subscriber looks at the membership once
        the log grew)."""
        if not self.leases.due() and self.leases.membership_worth_a_look(
                busy=bool(self.outstanding), watching=self.watch_when_idle, head=head):
            self.leases.check_membership(cursor, self.dialect, self.discovered)
        if not self.leases.due():
            return []
        idle = {key for key, state in self.partitions.items() if state.in_flight_count == 0}
        idle |= set(self.leases.owned) - set(self.partitions)
        # Nor one whose outcomes wait to be written (kept after a lock wait gave up, which
        # resets the partitions' view): released, they could not be, and ran again.
        idle -= {delivery.partition_key for delivery in self.outstanding.values()}
        self.leases.tick(cursor, self.dialect, self.discovered, idle,
                         may_release=self._within_in_flight_share)
        # Work exactly on the partitions held: new ones (and, after a reconnect, every
        # one) start from their durable watermark; lost ones are dropped.
        # A partition held again in a new tenure (its lease was lost or revoked by an
        # operator's repair, then acquired again, whatever its generation) starts afresh.
        for key, state in list(self.partitions.items()):
            if state.tenure != self.leases.tenure(key):
                del self.partitions[key]
        fresh = sorted(set(self.leases.owned) - set(self.partitions))
        for key in fresh:
            watermark = self.dialect.ensure_watermark(cursor, self.group, self.topic, key)
            self.watermarks.check_not_back(key, watermark)
            self.partitions[key] = PartitionState(key, watermark,
                                                  tenure=self.leases.tenure(key))
        if self.consumer.ordered:
            self.earlier_runs.wait_for(cursor, self.dialect,
                                       [self.partitions[key] for key in fresh],
                                       self.leases.owned)
        return self._take_back(self.leases.releasing)

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
        (fencing against a subscriber that was paused or cut off, guarantee I5)."""
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
            held = self.leases.generation(key)
            if owner != self.name or generation != held or age >= self.leases.duration_ms:
                del self.partitions[key]
                self.leases.lose(key, owner, generation, age)

    def has_work(self, outcomes: int, head: Callable[[], int]) -> bool:
        """Whether a cycle would write or read anything (if not, it costs no query)."""
        if outcomes:
            return True
        batch = self.options.batch_size
        now_ms = self.clock()
        may_start = self.allowance() != 0
        answered = self.fetcher.answered_offsets()
        for key, state in self.partitions.items():
            if state.window_open or state.wants_fetch(batch, head):
                return True
            if (may_start and self.leases.holds(key)
                    and state.ready(now_ms, batch, self.consumer.ordered,
                                    answered.get(key, ()))):
                return True
        return False

    # -- deliveries and watermarks (the fetcher's and the keeper's) ---------------------
    def poll(
        self, cursor: CursorWrapper, head: Callable[[], int], budget: int | None
    ) -> list[Delivery]:
        """Read what is new and return the deliveries to hand out now (marked delivered).
        ``budget`` caps their number (``--max-messages``; None: no cap), and so do the
        consumer's limits; a message whose attempts were spent unreported is
        dead-lettered here instead."""
        allowance = self.allowance()
        if allowance is not None:
            budget = allowance if budget is None else min(budget, allowance)
        deliveries, spent = self.fetcher.poll(cursor, head, budget)
        for delivery in spent:
            self._dead_letter(cursor, self.partitions.get(delivery.partition_key), delivery,
                              "crashed", (f"Gave up after {delivery.attempt - 1} attempt(s) "
                                          "that never completed (the worker stopped or the "
                                          "visibility timeout ran out)."))
        return deliveries

    def handed_out(self, deliveries: Iterable[Delivery]) -> None:
        """The transaction that marked ``deliveries`` committed: they are the handlers'."""
        count = 0
        for delivery in deliveries:
            self.outstanding[id(delivery)] = delivery
            count += 1
        self.stats["delivered"] += count

    def reads_on(self) -> bool:
        return self.fetcher.reads_on()

    def advance(self, cursor: CursorWrapper, settled_before: int | None,
                force: bool = False, delivering: bool = False) -> None:
        self.watermarks.advance(cursor, settled_before, force, delivering)

    # -- limits (rate_limit, max_in_flight) ---------------------------------------------
    def timed_out(self, delivery: Delivery) -> None:  # its handler thread still runs
        self.stuck.append(delivery)

    def still_stuck(self) -> list[Delivery]:
        self.stuck = [d for d in self.stuck if d.running]  # forget returned ones
        return self.stuck

    def in_flight(self) -> int:
        """Deliveries outstanding, and timed-out handlers still running."""
        return len(self.outstanding) + sum(1 for d in self.still_stuck()
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

    # -- outcomes -----------------------------------------------------------------------
    def record(self, cursor: CursorWrapper, outcomes: Iterable[Outcome]) -> None:
        """Write what the handlers did: ``recording.plan`` decides, ``write`` writes.
        Deliveries stay ``outstanding`` until the caller's transaction commits (and calls
        ``recorded``): a failed write is retried as the owner's, not dropped as a
        stranger's (the ack would be lost, the message run again)."""
        self.write(cursor, recording.plan(outcomes, outstanding=self.outstanding,
                                          partitions=self.partitions, options=self.options,
                                          now_ms=self.clock()))

    def write(self, cursor: CursorWrapper, plan: recording.Plan) -> None:
        """Give-backs, then one short transaction per dead letter, then the acks and
        retries of every partition in one statement; then the in-memory view follows."""
        self.stats["abandoned"] += plan.abandoned
        for give in plan.give_backs:
            delivery = give.delivery
            give_back(cursor, self.dialect, self.group, self.topic,
                      delivery.partition_key, delivery.row.offset, give.previous_retry_count)
            self.partitions[delivery.partition_key].given_back(delivery.row.offset)
        for dead in plan.dead_letters:
            self._dead_letter(cursor, self.partitions.get(dead.delivery.partition_key),
                              dead.delivery, dead.reason, dead.error)
        retries = self._write_outcomes(cursor, plan.ack_writes(), plan.retries)
        self.stats["acked"] += len(plan.finished)
        self.stats["retried"] += len(retries)
        for delivery in plan.finished:
            self.partitions[delivery.partition_key].finished(delivery.row.offset,
                                                             delivery.attempt)
        for retry in retries:
            self.partitions[retry.delivery.partition_key].retry_at(
                retry.delivery.row.offset, retry.invisible_until)

    def recorded(self, outcomes: Iterable[Outcome]) -> None:
        """The transaction that recorded ``outcomes`` committed: they are settled."""
        for outcome in outcomes:
            delivery = outcome.delivery
            self.outstanding.pop(id(delivery), None)
            if (state := self.partitions.get(delivery.partition_key)) is not None:
                state.run_ended(delivery.row.offset, delivery.attempt)

    def _write_outcomes(self, cursor: CursorWrapper, acks: list[Ack],
                        retries: list[recording.RetryOrder]) -> list[recording.RetryOrder]:
        """Acks and retries in one statement; returns the retries as written. Their
        backoffs start from a reading of the clock taken just before; if the statement
        waited for a lock, they are stamped again from a fresh one (the locks are held by
        now), so that no wait cuts one short (guarantee I9)."""
        now = self.clock()
        retries = [retry.stamped(now) for retry in retries]
        write_acks(cursor, self.dialect, self.group, self.topic, acks,
                   [retry.write() for retry in retries])
        stamped_at, now = now, self.clock()
        if retries and now - stamped_at > RESTAMP_AFTER_MS:
            retries = [retry.stamped(now) for retry in retries]
            write_acks(cursor, self.dialect, self.group, self.topic, [],
                       [retry.write() for retry in retries])
        return retries

    def _dead_letter(
        self, cursor: CursorWrapper, state: PartitionState | None, delivery: Delivery,
        reason: str, error: str,
    ) -> None:
        row = delivery.row
        with transaction.atomic(using=self.alias):
            copy_to_dead_letters(
                cursor, self.dialect, dead_letter_topic=self.topic + self.conf.DLQ_SUFFIX,
                group=self.group, message_id=published_id(row), offset=row.offset,
                attempts=delivery.attempt, error=error, reason=reason)
            write_acks(cursor, self.dialect, self.group, self.topic,
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
        if state is not None:
            state.finished(row.offset)

    # -- status -------------------------------------------------------------------------
    def busy(self) -> bool:
        now_ms = self.clock()
        return any(state.busy(now_ms) for state in self.partitions.values())

    def caught_up(self, head: Callable[[], int]) -> bool:
        """Every partition is held by a live subscriber, this one holds its fair share (or
        waited long enough for a holder to hand it over: a newcomer is not done while
        another member still drains the partitions that are to be its own), and it read
        each of its own to the end at the current head."""
        held = set(self.partitions) | self.leases.others
        return (self.finder.found_at(head) and not self.leases.awaiting_share()
                and all(key in held for key in self.discovered)
                and all(state.exhausted and state.covered >= head()
                        for state in self.partitions.values()))

    def done_above_watermarks(self) -> bool:
        """Does a held partition have rows done just above its watermark, which only the
        write horizon keeps it from passing?"""
        return any(state.done_above_watermark() for state in self.partitions.values())

    def stop(self, cursor: CursorWrapper) -> None:
        """Graceful stop: hand every partition over and deregister."""
        self.leases.release_all(cursor, self.dialect)
        self.partitions.clear()

    def next_due_ms(self) -> int | None:
        """When this subscription has work next (the database clock's epoch ms; None:
        nothing planned): a message due, or a look for new partitions put off."""
        dues = [d for d in (self._delivery_due_ms(), self.finder.due_ms(self.hold_clock()))
                if d is not None]
        return min(dues, default=None)

    def _delivery_due_ms(self) -> int | None:
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
