"""One subscription: a consumer group's view of one topic, across its partitions.

Runs on the runner's main thread and owns its database connection there. It owns the
partitions it holds, and parts that work on them: a ``PartitionFinder`` (discovery), its
``LeaseKeeper``, a ``Fetcher`` (reads new rows, marks the deliverable ones delivered for
the handler pool), a ``WatermarkKeeper``, the ``Deliveries`` ledger (what is in flight)
and an ``OutcomeRecorder`` (writes what the handlers did); here: the fence, the lease
change, its limits, and the status the Pacer reads.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable

from django.db.backends.utils import CursorWrapper

from sqlqueue import storage
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.delivering import Fetcher, HeldView
from sqlqueue.consuming.discovery import PartitionFinder
from sqlqueue.consuming.earlier_runs import EarlierRuns
from sqlqueue.consuming.handlers import Delivery
from sqlqueue.consuming.leases import LeaseChange, LeaseKeeper
from sqlqueue.consuming.ledger import Deliveries, FailingPartitions
from sqlqueue.consuming.limits import Limits
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.recorder import OutcomeRecorder
from sqlqueue.consuming.recording import DeadLetterOrder
from sqlqueue.consuming.registry import Consumer
from sqlqueue.consuming.watermarks import WatermarkKeeper

#: A batch consumer's deliveries outstanding (queued, held to fill or running), in
#: batches of its ``max_batch``, at most (or its ``batch_size``, if larger). Four was
#: slower in a drain of 20,000 (a pass marking 2,000 rows waited past RESTAMP_AFTER_MS
#: on a loaded machine, and stamped them again one statement per row).
BATCHES_AHEAD = 2


class Subscriber:
    def __init__(self, consumer: Consumer, conf: QueueSettings, alias: str,
                 name: str = "subscriber", *, clock: Callable[[], int],
                 hold_clock: Callable[[], int] | None = None,
                 check_server: Callable[[str], None] = lambda server: None,
                 watch_when_idle: bool = False,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
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
        # This host's clocks, for every part's timers (``HostClock``).
        self.host_clock = host_clock
        self.leases = LeaseKeeper(consumer.group, consumer.topic, name, conf.LEASE_DURATION,
                                  conf.LEASE_RENEW_INTERVAL, host_clock=host_clock)
        self.partitions: dict[str, PartitionState] = {}  # the partitions this one holds
        self.deliveries = Deliveries()  # handed to the pool, no outcome yet; stuck ones
        self.earlier_runs = EarlierRuns(consumer.group, consumer.topic, clock)  # ordered
        self.limits = None if consumer.rate_limit is None and consumer.max_in_flight is None \
            else Limits(consumer.rate_limit, consumer.max_in_flight,
                        warm_up=conf.LEASE_RENEW_INTERVAL, now=host_clock.monotonic)
        self.check_server = check_server  # raises if a fenced pass ran on another server
        # --until-empty: idle, it watches the membership too (WATCH_RECHECK) to take
        # over at once what a member that finished released, not at its next renewal.
        self.watch_when_idle = watch_when_idle
        self.finder = PartitionFinder(group=consumer.group, topic=consumer.topic,
                                      alias=alias, leases=self.leases,
                                      start_latest=consumer.start == "latest",
                                      host_clock=host_clock)
        # Its partitions' failed runs in a row: the recorder counts, the fetcher reads.
        self.failing = FailingPartitions()
        self.fetcher = Fetcher(consumer=consumer, options=self.options, alias=alias,
                               clock=clock, leases=self.leases, limits=self.limits,
                               partitions=self.partitions,
                               outstanding=self.deliveries.outstanding,
                               view=HeldView(self.leases, self.partitions, self.hold_clock),
                               host_clock=host_clock, failing=self.failing)
        self.watermarks = WatermarkKeeper(group=consumer.group, topic=consumer.topic,
                                          alias=alias, partitions=self.partitions,
                                          keep_delivery_state=conf.KEEP_DELIVERY_STATE,
                                          host_clock=host_clock)
        #: a batch consumer's: its acks are left to the watermark of the same pass
        #: (``Transactions.deliver``), not written a row each where it covers them
        self.defers_acks = consumer.batched
        self.recorder = OutcomeRecorder(consumer=consumer, options=self.options, alias=alias,
                                        dead_letter_topic=consumer.topic + conf.DLQ_SUFFIX,
                                        clock=clock, partitions=self.partitions,
                                        deliveries=self.deliveries, host_clock=host_clock,
                                        failing=self.failing)

    @property
    def stats(self) -> Counter[str]:
        """Its counts: delivered, acked, retried, dead_lettered, abandoned (the
        OutcomeRecorder writes them)."""
        return self.recorder.stats

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
        self.deliveries.forget()
        self.leases.forget()
        self.earlier_runs.forget()
    # -- partitions ---------------------------------------------------------------------
    def discover(self, cursor: CursorWrapper, head: Callable[[], int]) -> None:
        self.finder.discover(cursor, head, busy=bool(self.deliveries))

    def keep_leases(self, cursor: CursorWrapper, head: Callable[[], int] | None = None,
                    ) -> tuple[LeaseChange, list[Delivery]]:
        """The lease tick, when due: heartbeat, renew, rebalance; then start or stop
        working on the partitions gained or lost. Returns the tick's lease change, and
        the queued deliveries of partitions being handed over that were taken back from
        the pool. ``head``: the log's head, read when needed (an idle subscriber looks
        at the membership once the log grew)."""
        store = storage.store(self.alias)
        discovered = self.finder.discovered
        if not self.leases.due() and self.leases.membership_worth_a_look(
                busy=bool(self.deliveries), watching=self.watch_when_idle, head=head):
            self.leases.check_membership(cursor, store, discovered)
        if not self.leases.due():
            return LeaseChange(), []
        idle = {key for key, state in self.partitions.items() if state.in_flight_count == 0}
        idle |= set(self.leases.owned) - set(self.partitions)
        # Nor one whose outcomes wait to be written (kept after a lock wait gave up, which
        # resets the partitions' view): released, they could not be, and ran again.
        idle -= {delivery.partition_key for delivery in self.deliveries.running()}
        # Partitions go to a newcomer only once this process is within its new, smaller
        # max_in_flight share (the tick reads the members): that share is then free.
        change = self.leases.tick(cursor, store, discovered, idle, limits=self.limits,
                                  in_flight=self.deliveries.in_flight())
        # Work exactly on the partitions held: new ones (and, after a reconnect, every
        # one) start from their durable watermark; lost ones are dropped.
        # A partition held again in a new tenure (its lease was lost or revoked by an
        # operator's repair, then acquired again, whatever its generation) starts afresh.
        for key, state in list(self.partitions.items()):
            if state.tenure != self.leases.tenure(key):
                del self.partitions[key]
        self.failing.keep_only(self.partitions)
        fresh = sorted(set(self.leases.owned) - set(self.partitions))
        for key in fresh:
            watermark = store.ensure_watermark(cursor, self.consumer.group,
                                                 self.consumer.topic, key)
            self.watermarks.check_not_back(key, watermark)
            self.partitions[key] = PartitionState(key, watermark,
                                                  tenure=self.leases.tenure(key))
        if self.consumer.ordered:
            self.earlier_runs.wait_for(cursor, store,
                                       [self.partitions[key] for key in fresh],
                                       self.leases.owned)
        # The queued (not started) deliveries of partitions being handed over are taken
        # back, so that they fall idle and can be released without waiting for the
        # queue. No handler will start them: the caller records them as not started
        # (given back, no attempt charged) with the other outcomes, whose writes are
        # retried until they succeed.
        taken = self.deliveries.take_back(self.leases.releasing)
        if taken:
            self.leases.hurry()
        return change, taken

    def fence(self, cursor: CursorWrapper) -> None:
        """Inside the cycle's transaction: share-lock this (group, topic)'s leases and keep
        only the partitions still held with the same generation. Until the transaction
        ends nobody can take them over, so every write that follows is made as owner
        (fencing against a subscriber that was paused or cut off, guarantee I5)."""
        if not self.partitions:
            return
        # Only this subscriber's own lease rows (primary-key lookups): a peer paused inside
        # its own cycle transaction then blocks nobody's renewal, and nobody blocks ours.
        rows, server = storage.store(self.alias).fence_leases(cursor, self.consumer.group,
                                                      self.consumer.topic,
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
        if self.consumer.max_batch is not None:
            # A batch consumer's deliveries outstanding stay within its read-ahead (two
            # batches by default) across every partition: marking thousands at once only
            # lengthened the pass (and its visibility timeouts ran while they queued).
            # Those whose outcome this pass records count no more (not yet ``committed``:
            # that waits for the commit).
            waiting = sum(1 for d in self.deliveries.outstanding.values()
                          if d.queued or d.running)
            room = max(0, max(self.options.batch_size,
                              BATCHES_AHEAD * self.consumer.max_batch) - waiting)
            budget = room if budget is None else min(budget, room)
        deliveries, spent = self.fetcher.poll(cursor, head, budget)
        self.recorder.dead_letters(cursor, [DeadLetterOrder(delivery, "crashed", (
            f"Gave up after {delivery.attempt - 1} attempt(s) that never completed "
            "(the worker stopped or the visibility timeout ran out).")) for delivery in spent])
        return deliveries

    def handed_out(self, deliveries: Iterable[Delivery]) -> None:
        """The transaction that marked ``deliveries`` committed: they are the handlers'."""
        self.recorder.delivered(self.deliveries.handed_out(deliveries))

    # -- limits (rate_limit, max_in_flight) ---------------------------------------------
    def allowance(self) -> int | None:
        """How many messages the consumer's limits let start now (None: no limit)."""
        if self.limits is None:
            return None
        partitions = (set(self.finder.discovered) | set(self.leases.owned)
                      | self.leases.others)
        held = len(set(self.leases.owned) - self.leases.releasing)
        self.limits.share_leases(held, len(partitions))
        return self.limits.allowance(self.deliveries.in_flight(), self.leases.members,
                                     self.name)

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
                and all(key in held for key in self.finder.discovered)
                and all(state.exhausted and state.covered >= head()
                        for state in self.partitions.values()))

    def done_above_watermarks(self) -> bool:
        """Does a held partition have rows done just above its watermark, which only the
        write horizon keeps it from passing?"""
        return any(state.done_above_watermark() for state in self.partitions.values())

    def stop(self, cursor: CursorWrapper) -> None:
        """Graceful stop: hand every partition over and deregister."""
        self.leases.release_all(cursor, storage.store(self.alias))
        self.partitions.clear()

    def next_due_ms(self) -> int | None:
        """When this subscription has work next (the database clock's epoch ms; None:
        nothing planned): a message due, or a look for new partitions put off."""
        dues = [d for d in (self._delivery_due_ms(), self.finder.due_ms(self.hold_clock()))
                if d is not None]
        return min(dues, default=None)

    def _delivery_due_ms(self) -> int | None:
        batch, ordered = self.options.batch_size, self.consumer.ordered
        dues = [d for d in (s.next_due_ms(batch, ordered) for s in self.partitions.values())
                if d is not None]
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
