"""The runner's hand-off to its handler threads, and what comes back.

Work reaches the handlers through a priority queue (lower ``priority`` first) and comes
back through a completion queue that wakes the main thread. A delivery no handler started
(stopping, paused, its partition handed over, its lease no longer trusted) comes back as
"not started", and is given back with the other outcomes. A handler past its consumer's
``timeout`` counts as failed, and its thread is replaced. A mixin of ``Runner``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter

from django.db import connections

from sqlqueue import events
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming import handlers
from sqlqueue.consuming.handlers import Delivery, Outcome
from sqlqueue.consuming.instruments import Instruments
from sqlqueue.consuming.pauses import PauseWatch
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.wakeups import Doorbell

logger = logging.getLogger("sqlqueue.consumer")

#: Exit status of a process that stopped because a handler stayed stuck past its
#: consumer's timeout for the grace period (``exit_when_stuck``): its supervisor
#: replaces it at once (EX_TEMPFAIL).
EXIT_STUCK = 75


class HandOff:
    """``Runner``'s handler threads (it provides what is declared here)."""

    conf: QueueSettings
    alias: str
    name: str
    threads: int
    subscribers: list[Subscriber]
    instruments: Instruments
    pauses: PauseWatch
    stopping: threading.Event
    stats: Counter[str]
    exit_when_stuck: float | None
    exit_code: int
    _wakeup: Doorbell

    def __init__(self) -> None:
        self._work: queue.PriorityQueue[tuple[tuple[int, int], Delivery | None]] = (
            queue.PriorityQueue()
        )
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        # Outcomes taken from ``_done`` whose transaction did not commit (a lock wait gave
        # up, the connection dropped): recorded at the next pass, never dropped.
        self._unrecorded: list[Outcome] = []
        self._in_flight = 0
        self._dispatched = 0
        self._workers: list[threading.Thread] = []
        self._timed_out = 0  # handler threads stuck past their consumer's timeout

    def stop(self) -> None:
        self.stopping.set()
        self._wakeup.set()

    # -- handing out ----------------------------------------------------------------------
    def start_handler_threads(self) -> None:
        for n in range(self.threads):
            # Named after the runner too: several runners in one process (tests) apart.
            worker = threading.Thread(target=self._handler_thread,
                                      name=f"sqlqueue-handler-{n}@{self.name}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _dispatch(self, deliveries: list[Delivery]) -> None:
        """Hand committed deliveries to the handler threads."""
        for delivery in deliveries:
            self._in_flight += 1
            self._dispatched += 1
            self._work.put((delivery.sort_key(), delivery))

    # -- what comes back ------------------------------------------------------------------
    def _collect_outcomes(self) -> dict[int, list[Outcome]]:
        """What the handler threads finished since the last pass (and what an earlier pass
        could not record), by consumer."""
        outcomes: dict[int, list[Outcome]] = {}
        for outcome in self._unrecorded:
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
        self._unrecorded = []
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return outcomes
            self._in_flight -= 1
            outcomes.setdefault(id(outcome.delivery.consumer), []).append(outcome)
            self.stats[outcome.kind] += 1

    def _taken_back(self, deliveries: list[Delivery]) -> None:
        """Queued deliveries taken back on the main thread (partitions handed over, or
        shutdown): no longer in flight; given back at the next recording with the
        outcomes (retried until written)."""
        self._in_flight -= len(deliveries)
        self._unrecorded += [Outcome(delivery, "not_started") for delivery in deliveries]

    def _take_back_queued(self) -> None:
        """Shutdown: take back every delivery still queued (no handler started it)."""
        taken: list[Delivery] = []
        while True:
            try:
                _, delivery = self._work.get_nowait()
            except queue.Empty:
                break
            if delivery is not None and delivery.give_back():
                taken.append(delivery)
        self._taken_back(taken)

    def _stop_handler_threads(self) -> None:
        for n, _ in enumerate(self._workers):
            self._work.put(((1 << 30, n), None))  # after any real work; keys never tie
        for worker in self._workers:
            # Threads still stuck in a handler past SHUTDOWN_TIMEOUT are daemons: the
            # process may exit without them.
            worker.join(timeout=0 if self._in_flight > 0 or self._timed_out else 5)

    # -- handler timeouts (@consumer(timeout=...)) ----------------------------------------
    def _enforce_timeouts(self) -> None:
        """A handler running past its consumer's ``timeout`` counts as failed now (retried
        with backoff). Its thread cannot be stopped: a new one takes its place, and it
        exits when the handler returns, its outcome dropped."""
        now = time.monotonic()
        for subscriber in self.subscribers:
            limit = subscriber.consumer.timeout
            if limit is None:
                continue
            for delivery in list(subscriber.outstanding.values()):
                if (delivery.started_at and now - delivery.started_at > limit
                        and delivery.time_out()):
                    logger.warning("%s/%s@%s: the handler of %s ran past its timeout (%gs); "
                                   "counted as failed.", subscriber.topic,
                                   delivery.partition_key, delivery.row.offset,
                                   subscriber.group, limit)
                    self._done.put(Outcome(delivery, "fail", error=(
                        f"TimeoutError: the handler ran past its timeout of {limit:g}s.")))
                    subscriber.stuck.append(delivery)
                    self._replace_handler_thread()
            self._exit_if_stuck(subscriber, limit, now)

    def _exit_if_stuck(self, subscriber: Subscriber, limit: float, now: float) -> None:
        """Under a supervisor, a handler thread stuck past its timeout for
        ``exit_when_stuck`` more seconds stops the process (a thread cannot be killed;
        a process can be replaced)."""
        subscriber.stuck = [d for d in subscriber.stuck if d.running]  # forget returned ones
        grace = self.exit_when_stuck
        if grace is None or self.stopping.is_set():
            return
        stuck = [d for d in subscriber.stuck if now - d.started_at > limit + grace]
        if stuck:
            logger.error("%s: %s handler(s) of %s stuck for more than %gs past their timeout; "
                         "stopping this process so that its supervisor replaces it.",
                         self.name, len(stuck), subscriber.consumer.name, grace)
            self.exit_code = EXIT_STUCK
            self.stop()

    def _replace_handler_thread(self) -> None:
        self._timed_out += 1
        worker = threading.Thread(target=self._handler_thread, daemon=True,
                                  name=f"sqlqueue-handler-{len(self._workers)}@{self.name}")
        worker.start()
        self._workers.append(worker)


    # -- handler threads ----------------------------------------------------------------------
    def _handler_thread(self) -> None:
        try:
            self._handle_until_told_to_stop()
        finally:
            connections.close_all()  # this thread's own connections

    def _handle_until_told_to_stop(self) -> None:
        while True:
            _, delivery = self._work.get()
            if delivery is None:
                return
            if (self.stopping.is_set() or self._paused_delivery(delivery)) and (
                delivery.give_back()
            ):
                # Stopping or paused: nothing new starts; the main thread gives it back.
                self._done.put(Outcome(delivery, "not_started"))
                self._wakeup.set()
                continue
            if not delivery.start():
                if delivery.refused:
                    # The partition's lease is no longer trusted: nothing starts, and
                    # the main thread gives the message back.
                    self._done.put(Outcome(delivery, "not_started"))
                    self._wakeup.set()
                continue
            started = time.time()
            try:
                outcome = handlers.run(delivery)
            finally:
                if connections[self.alias].in_atomic_block:  # a handler left one open
                    connections[self.alias].close()
            self._instrument(outcome, started)
            if not delivery.finish():
                return  # timed out: counted as failed already, and this thread replaced
            self._done.put(outcome)
            # Wake the main thread once half of what is in flight has finished (or at
            # its next poll): outcomes are then recorded in batches, not one by one.
            if 2 * self._done.qsize() >= self._in_flight:
                self._wakeup.set()

    def _paused_delivery(self, delivery: Delivery) -> bool:
        return self.pauses.paused(delivery.consumer.group, delivery.consumer.topic)

    def _instrument(self, outcome: Outcome, started: float) -> None:
        row, consumer = outcome.delivery.row, outcome.delivery.consumer
        due_ms = max(row.created_at, row.deliver_after)  # this host's clock vs the database's
        duration = time.time() - started
        self.instruments.handled(consumer.group, consumer.topic, outcome.kind, duration,
                                 max(0.0, started - due_ms / 1000))
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

