"""Runners on the in-memory database, stepped by hand in one thread, on a manual clock.

``MemoryQueue`` registers a ``MemoryDatabase`` under two aliases (two connections to
one database, as two ``runconsumer`` processes have), and gives every time the engine
reads one source: the ``ManualClock``. The runner's database clock is it (``Runner(clock=
...)``), the store's ``now_ms`` is it, and so is the host clock passed to every part of
the engine that reads time (``Runner(host_clock=...)``: lease ticks, watermark steps,
garbage collection, rate and in-flight limits). No module's ``time`` is replaced, and
nothing waits: a test moves the clock.

``SteppedRunner`` is ``Runner`` with ``sqlqueue.testing``'s ``InlinePool``: a ``step()``
is one ``run_once()`` and then the handlers of what it handed out, on this thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connections

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming import gc
from sqlqueue.consuming.registry import Consumer
from sqlqueue.consuming.runner import Runner
from sqlqueue.integrations.tasks.retention import collect_results
from sqlqueue.testing.inline import InlinePool
from tests.engine.memory.base import register, unregister
from tests.engine.memory.tables import MemoryDatabase, Tables
from tests.manual_clock import ManualClock

#: the two aliases of one in-memory database
ALIASES = ("memory-a", "memory-b")
#: where the manual clock starts (epoch ms: 2026-01-01)
EPOCH_MS = 1_767_225_600_000
_databases = itertools.count(1)


class MemoryQueue:
    """One in-memory database reachable as ``ALIASES``, and its clock."""

    def __init__(self) -> None:
        self.clock = ManualClock(EPOCH_MS)
        self.database = MemoryDatabase(self.clock.now_ms)
        self.name = f"memory-{next(_databases)}"

    @property
    def tables(self) -> Tables:
        return self.database.tables

    def settings(self, alias: str = ALIASES[0], **overrides: Any) -> QueueSettings:
        """Runner settings on ``alias``: short intervals, in clock time."""
        values: dict[str, Any] = {
            "DATABASE": alias, "POLL_INTERVAL": 0.05, "MIN_BACKOFF": 0.05,
            "MAX_BACKOFF": 0.2, "VISIBILITY_TIMEOUT": 1.0, "LEASE_DURATION": 4.0,
            "LEASE_RENEW_INTERVAL": 1.0, "SHUTDOWN_TIMEOUT": 0, "WAKEUPS": False,
            "IDEMPOTENCY_WINDOW": 3600.0}
        values.update(overrides)
        return dataclasses.replace(QueueSettings(), **values)

    def runner(self, consumers: Sequence[Consumer], *, alias: str = ALIASES[0],
               name: str = "runner", **overrides: Any) -> SteppedRunner:
        return SteppedRunner(consumers, conf=self.settings(alias, **overrides), threads=1,
                             name=name, clock=self.clock, host_clock=self.clock)


class SteppedRunner(Runner):
    pool_class = InlinePool
    pool: InlinePool

    def step(self) -> int:
        """One pass, then the handlers of what it handed out (their outcomes are recorded
        by the next pass). Returns how many handlers ran."""
        self.run_once()
        return self.pool.run_handed_out()

    def stop_gracefully(self) -> None:
        """What SIGTERM leads to: the last outcomes recorded, watermarks moved over
        them, the leases handed over."""
        self.stop()
        self.shutdown()

    def kill(self) -> None:
        """The process dies: nothing more is written; its connection is gone (a server
        rolls back what it had open)."""
        self.stopping.set()
        connections[self.alias].close()


@contextmanager
def memory_queue(seed: int = 0) -> Iterator[MemoryQueue]:
    """A fresh in-memory database on ``ALIASES`` (its runners' clocks are its manual
    clock); the engine's own random choices (a retry's jitter) seeded with ``seed``."""
    queue = MemoryQueue()
    randomness = random.getstate()
    random.seed(seed)
    register(queue.name, queue.database)
    memory = {"ENGINE": "tests.engine.memory", "NAME": queue.name}
    configured = connections.configure_settings(
        {"default": dict(memory), **{alias: dict(memory) for alias in ALIASES}})
    connections.settings.update({alias: configured[alias] for alias in ALIASES})
    registered = list(gc._extra_collections)
    # Task results are ORM rows: not in the in-memory database (nothing writes them).
    gc._extra_collections[:] = [p for p in gc._extra_collections if p is not collect_results]
    try:
        yield queue
    finally:
        gc._extra_collections[:] = registered
        random.setstate(randomness)
        for alias in ALIASES:
            if alias in connections:  # opened in this thread
                connections[alias].close()
                del connections[alias]
            connections.settings.pop(alias, None)
        unregister(queue.name)
