"""A subscriber's deliveries: reading what is new in its partitions, choosing what may
start now, and marking it delivered (the visibility timeout starts) before it is handed to
the handler pool. ``Subscriber`` owns one ``Fetcher``; runs on the runner's main thread.
A delivery's handler thread asks the ``HeldView`` whether it may still start.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from django.db.backends.utils import CursorWrapper

from sqlqueue import storage
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.fairness import YIELD_SECONDS
from sqlqueue.consuming.handlers import Delivery
from sqlqueue.consuming.leases import LeaseKeeper
from sqlqueue.consuming.ledger import FailingPartitions
from sqlqueue.consuming.limits import Limits
from sqlqueue.consuming.partition import Entry, Hold, PartitionState
from sqlqueue.consuming.registry import Consumer, ConsumerOptions
from sqlqueue.storage.protocols import DeliveryStore

logger = logging.getLogger("sqlqueue.consumer")

#: A write stamped with a time (visibility, backoff) that took longer than this waited for
#: a lock: its time is stamped again from a fresh reading of the clock.
RESTAMP_AFTER_MS = 250
#: The widest range of offsets a poll asks ``partitions_with_rows`` about (stores that
#: ``narrows_fetches``): past it (a partition read to its end while the log grew by more)
#: the poll fetches every partition that may have rows, as the other stores do.
NARROWING_SPAN = 5000
#: A poll reads on through rows already done (``PartitionState.reads_on``) in up to this
#: many fetches, each asking for twice the rows of the one before, up to
#: ``READ_ON_WIDEST`` batches: a new holder of a partition whose previous holder acked
#: thousands of rows above the durable watermark read them a batch a poll, a poll interval
#: apart, and delivered nothing for a second after a rebalance.
READ_ON_FETCHES = 6
READ_ON_WIDEST = 16
_sequence = itertools.count()


class HeldView:
    """A subscriber's partitions as its handler threads see them: whether a delivery may
    still start, and holding one that ``extend_visibility()`` extended. Answers from the
    main thread's in-memory view (rebuilt after a lost lock wait) and the clock's
    estimate: never a query."""

    def __init__(self, leases: LeaseKeeper, partitions: dict[str, PartitionState],
                 hold_clock: Callable[[], int]) -> None:
        self.leases = leases
        self.partitions = partitions
        self.hold_clock = hold_clock

    def may_start(self, delivery: Delivery) -> bool:
        key = delivery.partition_key
        return (self.leases.holds(key)
                and self.leases.tenure(key) == delivery.tenure
                and not self._expired(delivery))

    def _expired(self, delivery: Delivery) -> bool:
        """Has the delivery's visibility timeout run out (as the main thread keeps it:
        stamped again while queued, extended by the handler), or was the message
        delivered again since, or finished? A partition or entry not read back yet is
        not judged here: the lease check is."""
        state = self.partitions.get(delivery.partition_key)
        if state is None:
            return False
        offset = delivery.row.offset
        if offset <= state.watermark:
            return True  # done, and the watermark passed it
        entry = state.entries.get(offset)
        if entry is None:
            return False
        return (entry.done or entry.attempt != delivery.attempt
                or PartitionState.overdue(entry, self.hold_clock()))

    def may_extend(self, delivery: Delivery) -> bool:
        """The lease of the delivery's tenure is still trusted (``LeaseKeeper.trusts``:
        a partition being handed over too, as its runs may go on until they end)."""
        return self.leases.trusts(delivery.partition_key, delivery.tenure)

    def hold(self, delivery: Delivery, seconds: float) -> None:
        """Not delivered again by this process before the new timeout (the clock's
        estimate, on the handler thread). Written to the delivery's ``Hold``, which its
        entry reads, never to the window: the main thread is the window's one writer."""
        delivery.hold.push_back(self.hold_clock() + round(seconds * 1000))


class Fetcher:
    """One subscription's reads and deliveries. The partitions and the deliveries in
    flight are the subscriber's (it adds and drops partitions); the fetcher reads rows
    into their states, marks what starts, and makes the deliveries."""

    def __init__(self, *, consumer: Consumer, options: ConsumerOptions, alias: str,
                 clock: Callable[[], int], leases: LeaseKeeper, limits: Limits | None,
                 partitions: dict[str, PartitionState], outstanding: dict[int, Delivery],
                 view: HeldView, host_clock: HostClock = SYSTEM_CLOCK,
                 failing: FailingPartitions | None = None) -> None:
        self.consumer = consumer
        self.options = options
        self.alias = alias
        self.clock = clock
        self.leases = leases
        self.limits = limits
        self.partitions = partitions
        self.outstanding = outstanding
        self.view = view
        self.host_clock = host_clock  # a Delivery's: when its handler started
        # The partitions whose runs all fail lately (the OutcomeRecorder counts them):
        # their deliveries yield to the healthy ones in the handler pool.
        self.failing = failing or FailingPartitions()

    @property
    def group(self) -> str:
        return self.consumer.group

    @property
    def topic(self) -> str:
        return self.consumer.topic

    @property
    def store(self) -> DeliveryStore:
        return storage.store(self.alias)

    def poll(
        self, cursor: CursorWrapper, head: Callable[[], int], budget: int | None
    ) -> tuple[list[Delivery], list[Delivery]]:
        """Read what is new and return the deliveries to hand out now (marked delivered),
        and those whose retry budget was spent by attempts never reported (to be
        dead-lettered by the caller, in this transaction).

        ``budget`` caps the number of deliveries (``--max-messages`` and the consumer's
        limits; None: no cap): what it holds back is not marked delivered (no attempt
        charged), and waits in the buffer.
        """
        batch = self.options.batch_size
        held = [state for key, state in self.partitions.items()
                if self.leases.holds(key)]  # not those being released or near their end
        self._fetch(cursor, [s for s in held if s.wants_fetch(batch, head)], head)
        self._adopt_outstanding()
        self._keep_queued_visible(cursor)
        chosen: list[tuple[PartitionState, Entry]] = []
        answered = self.answered_offsets()
        for state in held:
            ready = state.ready(self.clock(), batch, self.consumer.ordered,
                                answered.get(state.partition_key, ()),
                                run=self.consumer.max_batch or 1)
            if budget is not None:
                ready = ready[: max(0, budget - len(chosen))]
            chosen += [(state, entry) for entry in ready]
        if not chosen:
            return [], []
        if self.limits is not None:
            self.limits.spend(len(chosen))
        return self._deliver(cursor, chosen)

    def _adopt_outstanding(self) -> None:
        """Entries read again from the database (after a lost lock wait or connection
        the in-memory view is rebuilt) whose latest delivery is still this process's,
        queued or running: they are in flight, as before. Read as rows, they looked
        due once their visibility timeout ran out, and were delivered again beside a
        delivery still queued here, or one whose handler had already answered."""
        for delivery in self.outstanding.values():
            if not (delivery.queued or delivery.running):
                continue  # answered (its outcome decides), given back or refused
            state = self.partitions.get(delivery.partition_key)
            entry = state.entries.get(delivery.row.offset) if state else None
            if state is not None and delivery.running and (entry is None or entry.done):
                # Its message is done already (acked by an earlier attempt's late word):
                # the run still holds an ordered partition, as before the rebuild.
                state.overtaken(delivery.row.offset, delivery.attempt, self.clock()
                                + round(self.options.visibility_timeout * 1000))
                continue
            if (state is None or entry is None or entry.done or entry.in_flight
                    or entry.retry_count is None or entry.attempt != delivery.attempt):
                continue
            state.adopt(entry, delivery.hold)

    def _keep_queued_visible(self, cursor: CursorWrapper) -> None:
        """A delivery still waiting in the pool's queue when its visibility timeout runs
        out has not reached a handler: it is still this process's, and its timeout
        starts again rather than the message being delivered a second time (the queued
        one would run too: two runs of one message, overlapping in an ordered partition).
        Its timeout is stamped again from the database's now, fenced by this pass."""
        now_ms = self.clock()
        timeout_ms = round(self.options.visibility_timeout * 1000)
        overdue: list[tuple[PartitionState, Entry]] = []
        for delivery in self.outstanding.values():
            state = self.partitions.get(delivery.partition_key)
            entry = state.entries.get(delivery.row.offset) if state else None
            if (state is None or entry is None or not delivery.queued or not entry.in_flight
                    or entry.attempt != delivery.attempt
                    or not PartitionState.overdue(entry, now_ms)):
                continue
            overdue.append((state, entry))
        if not overdue:
            return
        self.store.restamp_visibility(
            cursor, self.group, self.topic,
            [(state.partition_key, entry.offset) for state, entry in overdue], timeout_ms)
        now_ms = self.clock()  # read after the statement, as for every stamp
        for state, entry in overdue:
            state.visible_again_at(entry, now_ms + timeout_ms)

    def answered_offsets(self) -> dict[str, set[int]]:
        """By partition, the offsets of deliveries whose handler has answered with an
        outcome not yet recorded (``Delivery.answered``)."""
        answered: dict[str, set[int]] = {}
        for delivery in self.outstanding.values():
            if delivery.answered:
                answered.setdefault(delivery.partition_key, set()).add(delivery.row.offset)
        return answered

    def _fetch(self, cursor: CursorWrapper, wanted: list[PartitionState],
               head: Callable[[], int]) -> None:
        """Read the next rows of every partition in ``wanted``, in one statement (one
        per partition made a poll after a publish cost a round trip per held
        partition)."""
        wanted = self._narrowed(cursor, wanted, head)
        batch = self.options.batch_size
        limit = batch
        for _ in range(READ_ON_FETCHES):
            if not wanted:
                return
            found = self.store.fetch_partitions(
                cursor, self.group, self.topic,
                [(state.partition_key, state.fetched_upto) for state in wanted], limit)
            # The head first, the clock after it: covered_at_ms must not be earlier than
            # the read that found the head, or a later write horizon could close the
            # window over a publisher still open (guarantee I4). Only a partition read to
            # its end asks for the head: a drain's full fetches read none.
            if any(len(found[state.partition_key]) < limit for state in wanted):
                head()
            now_ms = self.clock()
            for state in wanted:
                rows = found[state.partition_key]
                state.absorb(rows, self.group)
                state.fetched(len(rows), limit, head, now_ms)
            wanted = [state for state in wanted if state.reads_on(batch)]
            limit = min(limit * 2, batch * READ_ON_WIDEST)

    def reads_on(self) -> bool:
        """Does a held partition have rows to read on through now (``_fetch`` stopped at
        ``READ_ON_FETCHES``)? The runner then polls again at once."""
        batch = self.options.batch_size
        return any(state.reads_on(batch) for key, state in self.partitions.items()
                   if self.leases.holds(key))

    def _narrowed(self, cursor: CursorWrapper, wanted: list[PartitionState],
                  head: Callable[[], int]) -> list[PartitionState]:
        """Of ``wanted``, those worth a fetch, where the store asks first
        (``narrows_fetches``). A partition read to its end at an earlier head
        (``covered``) with no row between there and the head now is done with as an
        empty fetch would be: covered up to the head, at a clock read after the question.
        Rows committed late below that are the sweep's, as after an empty fetch."""
        exhausted = [state for state in wanted if state.exhausted]
        if len(exhausted) < 2 or not self.store.narrows_fetches:
            return wanted
        upto = head()
        after = min(state.covered for state in exhausted)
        if upto - after > NARROWING_SPAN:
            return wanted
        with_rows = self.store.partitions_with_rows(cursor, self.topic, after, upto)
        idle = {state.partition_key for state in exhausted
                if state.partition_key not in with_rows}
        if idle:
            now_ms = self.clock()
            for state in exhausted:
                if state.partition_key in idle:
                    state.fetched(0, self.options.batch_size, head, now_ms)
        return [state for state in wanted if state.partition_key not in idle]

    def _deliver(
        self, cursor: CursorWrapper, chosen: list[tuple[PartitionState, Entry]]
    ) -> tuple[list[Delivery], list[Delivery]]:
        """Mark every chosen message delivered, all partitions in one statement.

        Returned deliveries are not yet ``outstanding``: the caller hands them out (and
        calls ``handed_out``) only once the transaction that marked them has committed.
        The second list: deliveries past ``max_attempts``, not to be handed out."""
        invisible_until = self._mark_delivered(cursor, chosen)
        chosen = self._drop_acked_meanwhile(cursor, chosen)
        deliveries: list[Delivery] = []
        spent: list[Delivery] = []
        handed_out_at = self.host_clock.monotonic()
        for state, entry in chosen:
            if entry.in_flight:
                logger.warning(
                    "%s/%s@%s: the handler of attempt %s outlived the visibility timeout "
                    "(%ss); delivering it again.", self.topic, state.partition_key,
                    entry.offset, entry.attempt, self.options.visibility_timeout)
            hold = Hold()
            state.dispatched(entry, invisible_until, hold)
            assert entry.row is not None
            delivery = Delivery(self.consumer, self.alias, state.partition_key, entry.row,
                                entry.attempt, next(_sequence), view=self.view,
                                tenure=state.tenure, host_clock=self.host_clock, hold=hold)
            if self.failing.failing(state.partition_key):
                delivery.yields, delivery.place = True, handed_out_at + YIELD_SECONDS
            else:
                delivery.place = handed_out_at
            # Attempts charged but never reported (a worker died mid-handler, or gave up
            # past the visibility timeout) may have spent the retry budget.
            (spent if entry.attempt > self.options.max_attempts else deliveries).append(
                delivery)
        return deliveries, spent

    def _drop_acked_meanwhile(
        self, cursor: CursorWrapper, chosen: list[tuple[PartitionState, Entry]]
    ) -> list[tuple[PartitionState, Entry]]:
        """Of the redeliveries among ``chosen`` (in flight past their visibility timeout,
        or out of attempts: dead-lettered, not delivered, if still unacked), those whose
        row is acked are done, not delivered again: an atomic handler's transaction
        commits its ack itself, and one held up (a lock wait) can commit it just as its
        timeout runs out, before its outcome reaches this thread, or after another
        subscriber read the row (a takeover). The marking left those rows untouched;
        this reads them back (redeliveries only, and rare) as the marking found them (a
        locking read: the commit may be newer than this transaction's snapshot)."""
        spent_at = self.options.max_attempts  # the attempt before one past max_attempts
        redelivered = [(state.partition_key, entry.offset) for state, entry in chosen
                       if entry.in_flight or (entry.retry_count is not None
                                              and entry.attempt >= spent_at)]
        if not redelivered:
            return chosen
        acked = self.store.acked_among(cursor, self.group, self.topic, redelivered, lock=True)
        if not acked:
            return chosen
        for state, entry in chosen:
            if (state.partition_key, entry.offset) in acked:
                state.finished(entry.offset)
        return [(s, e) for s, e in chosen if (s.partition_key, e.offset) not in acked]

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
        self.store.mark_delivered(cursor, self.group, self.topic, [
            (state.partition_key, entry.offset, stamped_at + timeout_ms)
            for state, entry in chosen
        ])
        now = self.clock()
        if now - stamped_at > RESTAMP_AFTER_MS:
            logger.warning("%s/%s: marking %s message(s) delivered waited %.1fs; stamping "
                           "their visibility timeout again.", self.group, self.topic,
                           len(chosen), (now - stamped_at) / 1000)
            self.store.restamp_visibility(cursor, self.group, self.topic, [
                (state.partition_key, entry.offset) for state, entry in chosen], timeout_ms)
            now = self.clock()
        return now + timeout_ms
