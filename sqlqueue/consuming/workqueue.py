"""The handler threads' work queue: lowest key first, a pass's deliveries put in at once.

``queue.PriorityQueue`` takes its lock, pushes and notifies once per item: a pass handing
out 40 deliveries paid that 40 times on the runner's main thread (about 5 % of its CPU in
a drain). ``put_many`` pushes them all under one lock and wakes as many waiting threads as
there are items. ``get`` blocks; ``get_nowait`` raises ``queue.Empty`` as the standard
queue does. Keys never tie (each ends with a sequence number), so items are never
compared.
"""

from __future__ import annotations

import heapq
import queue
import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

Item = TypeVar("Item")
#: an entry's sort key: (priority, place in the queue, sequence)
Key = tuple[int, float, int]


class WorkQueue(Generic[Item]):
    """A blocking min-heap of (key, item) entries, shared by the main and handler threads."""

    def __init__(self) -> None:
        self._heap: list[tuple[Key, Item]] = []
        self._ready = threading.Condition(threading.Lock())

    def put(self, entry: tuple[Key, Item]) -> None:
        with self._ready:
            heapq.heappush(self._heap, entry)
            self._ready.notify()

    def put_many(self, entries: Iterable[tuple[Key, Item]]) -> None:
        """Put every entry in, then wake up to as many waiting threads."""
        with self._ready:
            count = 0
            for entry in entries:
                heapq.heappush(self._heap, entry)
                count += 1
            if count:
                self._ready.notify(count)

    def get(self) -> tuple[Key, Item]:
        """The lowest entry, waiting for one if there is none."""
        with self._ready:
            while not self._heap:
                self._ready.wait()
            return heapq.heappop(self._heap)

    def get_nowait(self) -> tuple[Key, Item]:
        with self._ready:
            if not self._heap:
                raise queue.Empty
            return heapq.heappop(self._heap)

    def qsize(self) -> int:
        """How many entries wait (a moment's answer, as ``queue.Queue.qsize``)."""
        return len(self._heap)

    def empty(self) -> bool:
        return not self._heap
