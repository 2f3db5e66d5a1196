"""Finding a topic's partitions for one subscription: a loose index scan, done again soon
while the log grows (a new head may mean a new partition), now and then while it does
not. ``Subscriber`` owns one ``PartitionFinder``; runs on the runner's main thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from django.db.backends.utils import CursorWrapper

from sqlqueue import storage
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.leases import LeaseKeeper

# While the log grows, partitions are looked for again after MIN_DISCOVERY_INTERVAL, or
# DISCOVERY_COST_FACTOR times what the last look took, whichever is longer: a new
# partition's first message waits about a poll, and a topic with many partitions spends
# at most 1/DISCOVERY_COST_FACTOR of its time looking.
MIN_DISCOVERY_INTERVAL = 0.1
DISCOVERY_COST_FACTOR = 20
DISCOVERY_IDLE_INTERVAL = 30.0  # ... and while it does not grow, now and then


class PartitionFinder:
    """The partitions one subscription found, and when it looks again."""

    def __init__(self, *, group: str, topic: str, alias: str, leases: LeaseKeeper,
                 start_latest: bool, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.group = group
        self.topic = topic
        self.alias = alias
        self.leases = leases
        self.discovered: list[str] = []
        self._discovered_at_head = -1
        self._next_discovery = 0.0
        self._deferred = False
        self._look_at = 0.0  # when a look put off is allowed (host monotonic seconds)
        self._head_read_at = -math.inf  # when discover last read the head
        # @consumer(start="latest"): placed at the topic's heads once, before any partition.
        self._start_placed = not start_latest

    def reset(self) -> None:
        """Look again at the next pass (the in-memory view is being rebuilt)."""
        self._discovered_at_head = -1
        self._next_discovery = self._look_at = 0.0
        self._head_read_at = -math.inf

    def look_again_now(self) -> None:
        """Look for new partitions at the next pass, however recently it looked: for a
        caller that knows the log grew (sqlqueue.testing, after its handlers published),
        rather than wait MIN_DISCOVERY_INTERVAL."""
        self._next_discovery = self._look_at = 0.0
        self._head_read_at = -math.inf

    def discover(self, cursor: CursorWrapper, head: Callable[[], int],
                 busy: bool = False) -> None:
        """Find the topic's partitions; new ones are leased at the next lease tick, which
        comes at once when nobody holds them. ``busy``: deliveries are in flight, and
        the passes follow each other quickly; the head is then read for this at most
        every MIN_DISCOVERY_INTERVAL (a drain's passes read nothing else of it: one
        statement a pass, about a tenth of a busy MariaDB pass)."""
        now = self.host_clock.monotonic()
        if busy and now - self._head_read_at < MIN_DISCOVERY_INTERVAL:
            # Put off like a look too soon (``due_ms``): the next pass may be far, once
            # handlers run and nothing is due (a pass woken by a new partition's first
            # message, while a delivery was still in flight, left it to the next poll).
            self._deferred = True
            self._look_at = max(self._look_at, self._head_read_at + MIN_DISCOVERY_INTERVAL)
            return
        self._head_read_at = now
        if now < self._next_discovery:
            # Looked too recently: look again as soon as allowed (``due_ms``), not at the
            # next poll, however far: the message that woke this pass may be a new
            # partition's first.
            self._deferred = True
            self._look_at = max(self._look_at, self._next_discovery)
            return
        self._deferred = False
        self._look_at = 0.0
        # A new head may mean a new partition: look again soon (see
        # MIN_DISCOVERY_INTERVAL); with no new message anywhere, only now and then.
        if head() == self._discovered_at_head and now < (
            self._next_discovery + DISCOVERY_IDLE_INTERVAL
        ):
            return
        store = storage.store(self.alias)
        self.discovered = store.discover_partitions(cursor, self.topic)
        if not self._start_placed:
            # Before the first lease tick creates any offsets row at 0: a new group
            # starts after what is stored now (a group with a position keeps it).
            store.start_at_heads(cursor, self.group, self.topic)
            self._start_placed = True
        took = self.host_clock.monotonic() - now
        held = set(self.leases.owned) | self.leases.others
        if any(key not in held for key in self.discovered):
            self.leases.hurry()
        self._discovered_at_head = head()
        self._next_discovery = now + max(MIN_DISCOVERY_INTERVAL, took * DISCOVERY_COST_FACTOR)

    def found_at(self, head: Callable[[], int]) -> bool:
        """Did the last look see the log at its current head?"""
        return self._discovered_at_head == head()

    def due_ms(self, now_ms: int) -> int | None:
        """When a look put off (``discover`` came too soon) is allowed (None: none is)."""
        if not self._deferred:
            return None
        wait = max(0.0, self._look_at - self.host_clock.monotonic())
        return now_ms + math.ceil(wait * 1000)
