"""A flood does not starve the healthy: a partition whose handler fails every message
waits behind the runner's healthy partitions for its handler threads.

A bad deploy or a downstream outage fails every message of a partition (or of a group),
each again after its backoff, and a failure that waits on the downstream (a connect
timeout) holds a handler thread as long as a success does. With the pool's queue first in,
first out, the healthy messages of the same group and of the runner's other groups waited
behind the failing ones' retries. Two rules, on the handler threads only (no statement
changes, nothing is delivered sooner or marked differently, no guarantee is touched):

- A partition is *failing* once its last ``FAILING_AFTER`` runs all failed (raised, asked
  for a retry, rejected, ran past their timeout); one ack makes it healthy again
  (``ledger.FailingPartitions``: one per subscription, on the runner's main thread,
  which hands each delivery of a failing partition out as one that *yields*).
- A delivery that yields goes, in the pool's queue, behind the healthy ones of its priority
  handed out up to ``YIELD_SECONDS`` after it (``Delivery.sort_key``; older ones go first:
  it is postponed, never starved); and the runs of such deliveries take at most half of
  the runner's handler threads (``FailingRuns``): the other half stays free for the
  healthy, so a healthy message waits for no failing run (a flood whose runs each wait
  out a downstream's timeout held every thread, and a wave of healthy messages queued
  behind it for that long). With one handler thread only the order applies.

A failing partition still has its ``batch_size`` in flight and every failing run is
recorded as before: the flood goes on at half the pool's pace when each of its runs holds
a thread for long, at its usual pace when its runs fail at once (the passes, not the
threads, are what a quick failure waits for).
"""

from __future__ import annotations

import threading
from typing import Any

#: How much later than it was handed out a delivery of a failing partition takes its
#: place in the pool's queue: healthy deliveries of its priority handed out within that
#: time go before it.
YIELD_SECONDS = 1.0


class FailingRuns:
    """The handler threads' share for deliveries that yield: at most half of the threads
    run them at once (one, with one or two threads). A handler thread that takes one from
    the queue while that many run holds it here, and takes the next item; the thread
    whose failing run ends puts the best held one back in the queue. ``HandlerPool``
    owns one; its handler threads and its shutdown call it (a lock: many threads)."""

    def __init__(self, threads: int) -> None:
        self.limit = max(1, threads // 2)
        self._lock = threading.Lock()
        self._running: set[int] = set()  # ids of the work items of the yielding runs
        self._held: list[tuple[Any, Any]] = []  # (sort key, work item)

    def start(self, key: Any, item: Any) -> bool:
        """May this thread run ``item`` (taken from the queue with ``key``) now? False:
        it is held, to go back to the queue when a yielding run ends."""
        if not yields(item):
            return True
        with self._lock:
            if len(self._running) >= self.limit:
                self._held.append((key, item))
                return False
            self._running.add(id(item))
            return True

    def ended(self, item: Any) -> tuple[Any, Any] | None:
        """``item``'s run ended (or timed out: its thread is replaced; the second call is
        a no-op): the best held item to put back in the queue, if any."""
        with self._lock:
            if id(item) not in self._running:
                return None
            self._running.discard(id(item))
            if not self._held:
                return None
            best = min(range(len(self._held)), key=lambda n: self._held[n][0])
            return self._held.pop(best)

    def release(self) -> list[Any]:
        """Shutdown: every held item (to give back with the queued ones)."""
        with self._lock:
            held, self._held = self._held, []
        return [item for _, item in held]


def yields(item: Any) -> bool:
    """A delivery of a failing partition, or a batch of nothing but such."""
    deliveries = getattr(item, "deliveries", None)
    if deliveries is not None:
        return all(d.yields for d in deliveries)
    return bool(getattr(item, "yields", False))
