"""The runner's hand-off to its handler threads, and what comes back.

Work reaches the handlers through a priority queue (lower ``priority`` first) and comes
back through a completion queue that wakes the main thread. A delivery no handler started
(stopping, paused, its partition handed over, its lease no longer trusted) comes back as
"not started", and is given back with the other outcomes. A handler past its consumer's
``timeout`` counts as failed, and its thread is replaced. ``Runner`` owns one; every
attribute here is the pool's own, and what it needs from the runner is passed in.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import connections

from sqlqueue import events
from sqlqueue.consuming import batches, handlers
from sqlqueue.consuming.batches import Batch, Filling
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.fairness import FailingRuns
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.ledger import Deliveries
from sqlqueue.consuming.registry import Consumer
from sqlqueue.consuming.workqueue import WorkQueue
from sqlqueue.wakeups import Doorbell

logger = logging.getLogger("sqlqueue.consumer")

#: Exit status of a process that stopped because a handler stayed stuck past its
#: consumer's timeout for the grace period (``exit_when_stuck``): its supervisor
#: replaces it at once (EX_TEMPFAIL).
EXIT_STUCK = 75


class HandlerPool:
    """The runner's handler threads: what is queued for them, what they finished, and
    how much is in flight between the two."""

    def __init__(self, *, name: str, threads: int, alias: str, instruments: Instruments,
                 stopping: threading.Event, wakeup: Doorbell,
                 paused: Callable[[str, str], bool],
                 exit_when_stuck: float | None, on_stuck: Callable[[], None],
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.name = name  # the runner's: its threads are named after it
        self.threads = threads
        self.alias = alias
        self.instruments = instruments
        self.stopping = stopping
        self.wakeup = wakeup
        self.paused = paused  # (group, topic) -> is that subscription paused now?
        #: outcomes collected, by kind (ack, fail, ...): ``Runner.stats``
        self.stats: Counter[str] = Counter()
        self.exit_when_stuck = exit_when_stuck
        self.on_stuck = on_stuck  # called once a handler stays stuck past the grace
        self.work: WorkQueue[Delivery | Batch | None] = WorkQueue()
        # Failing partitions' runs take at most half of the threads (fairness.py).
        self.failing_runs = FailingRuns(threads)
        # Batch consumers' deliveries held to fill a batch (their ``max_wait``).
        self.filling = Filling(host_clock)
        self.done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        # Outcomes taken from ``done`` whose transaction did not commit (a lock wait gave
        # up, the connection dropped): recorded at the next pass, never dropped.
        self.unrecorded: list[Outcome] = []
        self.in_flight = 0
        self.dispatched = 0
        self.workers: list[threading.Thread] = []
        # Each handler thread's own connection wrapper, looked up once: Django's
        # ``connections[alias]`` goes through asgiref's context-local storage, which cost
        # a few per cent of a drain's CPU when asked after every message.
        self._thread = threading.local()
        self._timed_out = 0  # handler threads stuck past their consumer's timeout

    def has_outcomes(self) -> bool:
        """Outcomes wait to be recorded (finished, or not recorded by an earlier pass)."""
        return not self.done.empty() or bool(self.unrecorded)

    def outcomes_due(self) -> bool:
        """Should a pass record the outcomes now? Yes once three quarters of what is in
        flight has finished, when an earlier pass could not record some, or when fewer
        deliveries wait in the queue than there are threads (the threads would soon wait
        for the pass that makes room and refills it). Otherwise the threads are busy with the
        queue: a pass now would record a few outcomes at the cost of a whole pass (a
        fence, a fetch, a commit), and the loop passed back to back at ~30 messages a
        pass with over 100 still queued."""
        return (bool(self.unrecorded) or 4 * self.done.qsize() >= 3 * self.in_flight
                or self.work.qsize() < self.threads)

    def keep_unrecorded(self, outcomes: Iterable[Outcome]) -> None:
        """Outcomes whose transaction did not commit: recorded at the next pass."""
        self.unrecorded += outcomes

    # -- handing out ----------------------------------------------------------------------
    def report_to(self, instruments: Instruments) -> None:
        self.instruments = instruments

    def start(self) -> None:
        for n in range(self.threads):
            # Named after the runner too: several runners in one process (tests) apart.
            worker = threading.Thread(target=self._handler_thread,
                                      name=f"sqlqueue-handler-{n}@{self.name}", daemon=True)
            worker.start()
            self.workers.append(worker)

    def dispatch(self, deliveries: list[Delivery]) -> None:
        """Hand committed deliveries (of one subscription) to the handler threads: a batch
        consumer's as batches, one work item each (held to fill, up to its ``max_wait``)."""
        self.in_flight += len(deliveries)
        self.dispatched += len(deliveries)
        if deliveries and deliveries[0].consumer.max_batch is not None:  # a batch consumer
            self._queue_batches(self.filling.add(deliveries[0].consumer, deliveries))
            return
        self.work.put_many([(delivery.sort_key(), delivery) for delivery in deliveries])

    def dispatch_filled(self) -> None:
        """Hand out the batches held past their consumer's ``max_wait``."""
        if self.filling.held:
            self._queue_batches(self.filling.due())

    def next_filled_in(self) -> float | None:
        """Seconds until a held batch is due (None: none held): the runner's longest wait."""
        return self.filling.next_in()

    def _queue_batches(self, ready: list[Batch]) -> None:
        self.work.put_many([(batch.sort_key(), batch) for batch in ready])

    # -- what comes back ------------------------------------------------------------------
    def collect(self) -> dict[int, list[Outcome]]:
        """What the handler threads finished since the last pass (and what an earlier pass
        could not record), by consumer."""
        outcomes: dict[int, list[Outcome]] = {}
        for outcome in self.unrecorded:
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
        self.unrecorded = []
        while True:
            try:
                outcome = self.done.get_nowait()
            except queue.Empty:
                return outcomes
            self.in_flight -= 1
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
            self.stats[outcome.kind] += 1

    def lost(self) -> None:
        """A delivery's outcome will never come back (its handler was interrupted)."""
        self.in_flight -= 1

    def taken_back(self, deliveries: list[Delivery]) -> None:
        """Queued deliveries taken back on the main thread (partitions handed over, or
        shutdown): no longer in flight; given back at the next recording with the
        outcomes (retried until written)."""
        self.in_flight -= len(deliveries)
        self.unrecorded += [Outcome(delivery, "not_started") for delivery in deliveries]

    def take_back_queued(self) -> None:
        """Shutdown: take back every delivery still queued (no handler started it)."""
        taken = [delivery for delivery in self.filling.release() if delivery.give_back()]
        for held in self.failing_runs.release():
            self.work.put((held.sort_key(), held))  # taken back below, with the queued
        while True:
            try:
                _, item = self.work.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                taken += [delivery for delivery in item.deliveries if delivery.give_back()]
            elif item is not None and item.give_back():
                taken.append(item)
        self.taken_back(taken)

    def stop_threads(self) -> None:
        for n, _ in enumerate(self.workers):
            self.work.put(((1 << 30, 0.0, n), None))  # after any real work; keys never tie
        for worker in self.workers:
            # Threads still stuck in a handler past SHUTDOWN_TIMEOUT are daemons: the
            # process may exit without them.
            worker.join(timeout=0 if self.in_flight > 0 or self._timed_out else 5)

    # -- handler timeouts (@consumer(timeout=...)) ----------------------------------------
    def enforce_timeouts(self, ledgers: Iterable[tuple[Consumer, Deliveries]]) -> None:
        """A handler running past its consumer's ``timeout`` counts as failed now (retried
        with backoff). Its thread cannot be stopped: a new one takes its place, and it
        exits when the handler returns, its outcome dropped. ``ledgers``: each
        subscription's consumer and its ``Deliveries``."""
        now = self.host_clock.monotonic()
        for consumer, deliveries in ledgers:
            limit = consumer.timeout
            if limit is None:
                continue
            replaced: set[int] = set()  # a batch's deliveries share one thread (``run``)
            for delivery in deliveries.running():
                if (delivery.started_at and now - delivery.started_at > limit
                        and delivery.time_out()):
                    logger.warning("%s/%s@%s: the handler of %s ran past its timeout (%gs); "
                                   "counted as failed.", consumer.topic,
                                   delivery.partition_key, delivery.row.offset,
                                   consumer.group, limit)
                    self.done.put(Outcome(delivery, "fail", error=(
                        f"TimeoutError: the handler ran past its timeout of {limit:g}s.")))
                    deliveries.timed_out(delivery)
                    self._failing_run_ended(delivery)  # its thread is replaced
                    thread = delivery.run or -id(delivery)
                    if thread not in replaced:
                        replaced.add(thread)
                        self._replace_handler_thread()
            self._exit_if_stuck(consumer, deliveries, limit, now)

    def _exit_if_stuck(self, consumer: Consumer, deliveries: Deliveries, limit: float,
                       now: float) -> None:
        """Under a supervisor, a handler thread stuck past its timeout for
        ``exit_when_stuck`` more seconds stops the process (a thread cannot be killed;
        a process can be replaced)."""
        running = deliveries.still_stuck()
        grace = self.exit_when_stuck
        if grace is None or self.stopping.is_set():
            return
        stuck = [d for d in running if now - d.started_at > limit + grace]
        if stuck:
            logger.error("%s: %s handler(s) of %s stuck for more than %gs past their timeout; "
                         "stopping this process so that its supervisor replaces it.",
                         self.name, len(stuck), consumer.name, grace)
            self.on_stuck()

    def _replace_handler_thread(self) -> None:
        self._timed_out += 1
        worker = threading.Thread(target=self._handler_thread, daemon=True,
                                  name=f"sqlqueue-handler-{len(self.workers)}@{self.name}")
        worker.start()
        self.workers.append(worker)

    # -- handler threads ----------------------------------------------------------------------
    def _handler_thread(self) -> None:
        self._thread.connection = connections[self.alias]
        try:
            self._handle_until_told_to_stop()
        finally:
            connections.close_all()  # this thread's own connections

    def _handle_until_told_to_stop(self) -> None:
        while True:
            key, item = self.work.get()
            if item is None:
                return
            if not self.failing_runs.start(key, item):
                continue  # held: back in the queue once a failing partition's run ends
            try:
                go_on = (self._handle_batch(item) if isinstance(item, Batch)
                         else self._handle_delivery(item))
            finally:
                self._failing_run_ended(item)
            if not go_on:
                return  # timed out: counted as failed already, and this thread replaced

    def _failing_run_ended(self, item: Delivery | Batch) -> None:
        """A failing partition's run ended (or timed out): one it held goes back."""
        held = self.failing_runs.ended(item)
        if held is not None:
            self.work.put(held)

    def _handle_delivery(self, delivery: Delivery) -> bool:
        """Run one delivery's handler; False if it ran past its timeout (its outcome
        decided already: this thread is replaced, and ends)."""
        if (self.stopping.is_set() or self._paused_delivery(delivery)) and (
            delivery.give_back()
        ):
            # Stopping or paused: nothing new starts; the main thread gives it back.
            self.done.put(Outcome(delivery, "not_started"))
            self.wakeup.set()
            return True
        if not delivery.start():
            if delivery.refused:
                # The partition's lease is no longer trusted: nothing starts, and
                # the main thread gives the message back.
                self.done.put(Outcome(delivery, "not_started"))
                self.wakeup.set()
            return True
        started = self.host_clock.wall()
        try:
            outcome = handlers.handle(delivery)
        finally:
            self._close_a_transaction_left_open()
        self._instrument(outcome, started)
        if not delivery.finish():
            return False
        self.done.put(outcome)
        # Wake the main thread once the outcomes are due (or at its next poll): they are
        # then recorded in batches, not one by one.
        if self.outcomes_due():
            self.wakeup.set()
        return True

    def _close_a_transaction_left_open(self) -> None:
        """A handler that left a transaction open on this thread's connection: close the
        connection (rolled back), so that the next handler does not run inside it."""
        connection = getattr(self._thread, "connection", None) or connections[self.alias]
        if connection.in_atomic_block:
            connection.close()

    def _handle_batch(self, batch: Batch) -> bool:
        """Run a batch consumer's handler once for ``batch``; False if it ran past its
        timeout (its outcomes decided already: this thread is replaced, and ends)."""
        first = batch.deliveries[0]
        if self.stopping.is_set() or self._paused_delivery(first):
            given = [d for d in batch.deliveries if d.give_back()]
            self._send([Outcome(d, "not_started") for d in given])
            return True
        started, refused = batches.start_all(batch.deliveries, first.consumer.ordered)
        self._send([Outcome(d, "not_started") for d in refused])
        if not started:
            return True
        began = self.host_clock.wall()
        try:
            outcomes = batches.run_batch(started)
        finally:
            self._close_a_transaction_left_open()
        self.instruments.batch(first.consumer.group, first.consumer.topic, len(started))
        in_time = [o for o in outcomes if o.delivery.finish()]
        for outcome in in_time:
            if outcome.kind != "not_started":
                self._instrument(outcome, began)
        self._send(in_time)
        return len(in_time) == len(outcomes)

    def _send(self, outcomes: list[Outcome]) -> None:
        """Outcomes back to the main thread, woken as for single deliveries."""
        if not outcomes:
            return
        for outcome in outcomes:
            self.done.put(outcome)
        if self.outcomes_due():
            self.wakeup.set()

    def _paused_delivery(self, delivery: Delivery) -> bool:
        return self.paused(delivery.consumer.group, delivery.consumer.topic)

    def _instrument(self, outcome: Outcome, started: float) -> None:
        row, consumer = outcome.delivery.row, outcome.delivery.consumer
        due_ms = max(row.created_at, row.deliver_after)  # this host's clock vs the database's
        duration = self.host_clock.wall() - started
        self.instruments.handled(consumer.group, consumer.topic, outcome.kind, duration,
                                 max(0.0, started - due_ms / 1000))
        self.instruments.finished(outcome.delivery, outcome.kind, duration)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s/%s@%s: %s after %.3fs (attempt %s).", consumer.topic,
                         outcome.delivery.partition_key, row.offset, outcome.kind, duration,
                         outcome.delivery.attempt,
                         extra=events.fields(events.MESSAGE_HANDLED, group=consumer.group,
                                             topic=consumer.topic,
                                             partition=outcome.delivery.partition_key,
                                             offset=row.offset,
                                             attempt=outcome.delivery.attempt,
                                             outcome=outcome.kind, duration=duration))

