"""Garbage collection of the message log (guarantee I8).

A row may go once every *known* group of its topic is done with it (its watermark on that
partition covers the row) and RETENTION has passed since then. Known groups are those
with a ``queue_offsets`` row on any partition of the topic, plus the groups this process
runs; a known group without a row on a partition has a watermark of 0 there, which holds
that partition's rows back (a stopped group keeps counting until an operator removes it).
Topics nobody consumes, dead-letter topics among them, are never collected. With
``KEEP_DELIVERY_STATE`` the groups' delivery state of collected rows goes with them.

The same passes delete the idempotency keys whose ``IDEMPOTENCY_WINDOW`` has passed (a
key outlives its message, not the window), and run the extra collections integrations
register with ``register_collection`` (the Tasks backend's expired results, the live
overview's old minutes): this layer imports none of them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from sqlqueue import storage
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock

logger = logging.getLogger("sqlqueue.gc")

GC_INTERVAL = 10.0  # seconds between passes over a topic
GC_BATCH = 1000  # rows per DELETE: short transactions, short locks
#: DELETEs of one pass over a topic at most (but when forced); the partitions left go in
#: the passes that follow, at once. A pass runs on the consumer loop's thread: sixteen
#: partitions' deletes in one held a message that arrived meanwhile for 15 ms.
GC_DELETES_PER_PASS = 4
#: offsets one DELETE of a forced pass (``manage.py queue gc``) covers at most: it sweeps
#: the log by windows of the primary key (``delete_messages_in_window``), at most this
#: many rows a statement (0.1-0.7 s each on MariaDB with a cold 2M-row table).
GC_SWEEP_WINDOW = 10_000
#: what one DELETE of a sweep aims to take (seconds): a window that took longer makes the
#: next one smaller (down to ``GC_SWEEP_MIN_WINDOW``), one that took less makes it larger
#: again (at most twice, up to ``GC_SWEEP_WINDOW``), per topic. Each statement is one
#: transaction: this bounds how long its locks, undo and redo last, on a busy database
#: too (measured: docs/benchmarks.md, "Scale: a log of millions").
GC_CHUNK_SECONDS = 0.1
GC_SWEEP_MIN_WINDOW = 500
#: partitions a sweep names at most (two parameters each: within SQLite's oldest limit
#: of 999); a topic with more is collected partition by partition.
GC_SWEEP_PARTITIONS = 400

#: (database alias, batch size) -> (rows deleted, whether more may be left)
ExtraCollection = Callable[[str, int], tuple[int, bool]]
_extra_collections: list[ExtraCollection] = []


def register_collection(collection: ExtraCollection) -> None:
    """Have every garbage-collection pass also run ``collection`` (once each)."""
    if collection not in _extra_collections:
        _extra_collections.append(collection)


class GarbageCollector:
    def __init__(self, conf: QueueSettings, alias: str, known_groups: dict[str, set[str]],
                 *, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.conf = conf
        self.alias = alias
        self.known_groups = known_groups  # topic -> groups running in this process
        self._next_pass: dict[str, float] = {}
        # (monotonic time, collectable offset) per (topic, partition), for RETENTION
        self._history: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        # Per (topic, partition): every row up to here is gone. No row can appear below
        # it later (a watermark passes settled rows only), so a partition whose
        # collectable offset did not move costs no DELETE.
        self._collected: dict[tuple[str, str], int] = {}
        # Per topic: offsets its sweep's next DELETE covers (none yet: GC_SWEEP_WINDOW).
        self._window: dict[str, int] = {}
        self._next_results_pass = 0.0
        self._next_keys_pass = 0.0
        self.deleted = 0  # messages
        self.results_deleted = 0  # task results
        self.keys_deleted = 0  # expired idempotency keys

    def collect(self, cursor: Any, force: bool = False) -> int:
        """One bounded pass over the topics whose turn it is, and over expired task
        results when theirs is; returns rows deleted (messages and results)."""
        now = self.host_clock.monotonic()
        deleted = 0
        for topic in self.known_groups:
            if not force and now < self._next_pass.get(topic, 0.0):
                continue
            removed, more = self._collect_topic(cursor, topic,
                                                None if force else GC_DELETES_PER_PASS)
            deleted += removed
            self._next_pass[topic] = now + (0.0 if more else GC_INTERVAL)
        self.deleted += deleted
        return deleted + self._collect_extras(now, force) + self._collect_keys(cursor, now, force)

    def _collect_keys(self, cursor: Any, now: float, force: bool) -> int:
        # A forced pass too waits for the interval once a pass left none: ``queue gc``
        # sweeping a backlog runs a pass per window of the log, and two more DELETEs in
        # each are wasted once the keys and results are done.
        if now < self._next_keys_pass:
            return 0
        store = storage.store(self.alias)
        self._next_keys_pass = now + GC_INTERVAL
        try:
            removed = store.delete_expired_idempotency_keys(cursor, GC_BATCH)
        except DatabaseError as exc:
            # MariaDB's range DELETE waits for the next-key lock of a key a publisher's
            # open transaction inserted: give up until the next interval, not the pass
            # (the runner's whole cycle failed with it, again each pass: a runner made no
            # progress while any idempotent publish stayed open).
            if not store.is_lock_wait(exc):
                raise
            logger.info("Expired idempotency keys not deleted this time (%s): a publishing "
                        "transaction holds a lock; again in %ss.", exc, GC_INTERVAL)
            return 0
        self._next_keys_pass = now + (0.0 if removed == GC_BATCH else GC_INTERVAL)
        self.keys_deleted += removed
        return removed

    def _collect_extras(self, now: float, force: bool) -> int:
        if now < self._next_results_pass:  # forced too: as ``_collect_keys``
            return 0
        removed, more = 0, False
        for collection in _extra_collections:
            deleted, left = collection(self.alias, GC_BATCH)
            removed, more = removed + deleted, more or left
        self._next_results_pass = now + (0.0 if more else GC_INTERVAL)
        self.results_deleted += removed
        return removed

    def _collect_topic(self, cursor: Any, topic: str,
                       budget: int | None) -> tuple[int, bool]:
        """Delete what every group is done with, in at most ``budget`` DELETEs (None: no
        limit); returns rows deleted, and whether more may be left."""
        store = storage.store(self.alias)
        groups, watermarks = store.topic_watermarks(cursor, topic)
        # When the watermarks were seen: after the read (which may have waited), so that
        # RETENTION is never counted from before a watermark got where it is.
        seen_at = self.host_clock.monotonic()
        groups |= self.known_groups.get(topic, set())
        if not groups:
            return 0, False
        todo: dict[str, int] = {}  # partition -> the offset it may be collected up to
        for partition, by_group in watermarks.items():
            collectable = min(by_group.get(group, 0) for group in groups)
            upto = self._retained(topic, partition, collectable, seen_at)
            if upto > self._collected.get((topic, partition), 0):
                todo[partition] = upto
        if budget is None and 0 < len(todo) <= GC_SWEEP_PARTITIONS:
            state_groups = {g for by_group in watermarks.values() for g in by_group}
            return self._sweep(cursor, topic, todo, state_groups)
        deleted, more = 0, False
        for partition, upto in todo.items():
            by_group = watermarks[partition]
            if budget is not None:
                if budget == 0:
                    more = True  # the next pass goes on at once
                    continue
                budget -= 1
            removed = store.delete_messages_upto(cursor, topic, partition, upto, GC_BATCH)
            deleted += removed
            if removed and self.conf.KEEP_DELIVERY_STATE:
                # The groups' delivery state was kept for the analytics report: it goes
                # with its messages (a primary-key range per group).
                for group in by_group:
                    store.delete_states_upto(cursor, group, topic, [(partition, upto)])
            if removed == GC_BATCH:
                more = True
            else:
                self._collected[(topic, partition)] = upto
        if deleted:
            logger.info("Garbage-collected %s message(s) of topic %r.", deleted, topic)
        return deleted, more

    def _sweep(self, cursor: Any, topic: str, todo: dict[str, int],
               state_groups: set[str]) -> tuple[int, bool]:
        """A forced pass over a topic (``manage.py queue gc``): delete what ``todo``
        allows (partition -> offset) window by window of the primary key, from the
        oldest row stored, until a window deleted rows (the caller reports progress
        between passes) or the sweep is done; returns rows deleted and whether more may
        be left. The next pass starts from the oldest row left, which is where this one
        stopped (``_collected``: how far each partition was swept)."""
        store = storage.store(self.alias)
        partitions = sorted(todo)
        firsts = store.first_offsets_above(
            cursor, topic, [(p, self._collected.get((topic, p), 0)) for p in partitions])
        limits: dict[str, int] = {}
        oldest: int | None = None  # the oldest row to delete
        for partition, first in zip(partitions, firsts, strict=True):
            if first is None or first > todo[partition]:
                self._collected[(topic, partition)] = todo[partition]  # nothing to delete
            else:
                limits[partition] = todo[partition]
                oldest = first if oldest is None else min(oldest, first)
        if oldest is None:
            return 0, False
        after = oldest - 1
        end = max(limits.values())
        deleted = 0
        while after < end and not deleted:
            span = min(self._window.get(topic, GC_SWEEP_WINDOW), GC_SWEEP_WINDOW)
            upto = min(after + span, end)
            window = [(p, limit) for p, limit in sorted(limits.items()) if limit > after]
            began = self.host_clock.monotonic()
            deleted = store.delete_messages_in_window(cursor, topic, after, upto, window)
            if deleted:
                self._window[topic] = next_window(upto - after,
                                                  self.host_clock.monotonic() - began)
            swept = [(p, min(limit, upto)) for p, limit in window]
            if deleted and self.conf.KEEP_DELIVERY_STATE:
                # The groups' delivery state of the rows collected goes with them.
                for group in sorted(state_groups):
                    store.delete_states_upto(cursor, group, topic, swept)
            # Every row of these partitions up to here is gone: the next pass seeks
            # from here, not over the rows deleted (PostgreSQL keeps them as dead
            # tuples until a vacuum, and walked them again at every pass: 156,000
            # rows/s at the start of a 2M-row sweep, 44,000 on average).
            self._collected.update(((topic, p), gone) for p, gone in swept)
            after = upto
        if deleted:
            logger.info("Garbage-collected %s message(s) of topic %r.", deleted, topic)
        return deleted, after < end

    def _retained(self, topic: str, partition: str, collectable: int, now: float) -> int:
        """The highest offset every group finished at least RETENTION seconds ago."""
        if self.conf.RETENTION <= 0:
            return collectable
        history = self._history.setdefault((topic, partition), deque())
        if not history or history[-1][1] != collectable:
            history.append((now, collectable))
        upto = 0
        while history and now - history[0][0] >= self.conf.RETENTION:
            upto = history[0][1]
            if len(history) > 1 and now - history[1][0] >= self.conf.RETENTION:
                history.popleft()
            else:
                break
        return upto


def next_window(span: int, took: float) -> int:
    """The offsets a sweep's next DELETE covers, after one of ``span`` offsets that took
    ``took`` seconds: sized to take ``GC_CHUNK_SECONDS``, at most twice ``span``, within
    ``GC_SWEEP_MIN_WINDOW`` and ``GC_SWEEP_WINDOW``."""
    sized = 2 * span if took <= 0 else int(span * GC_CHUNK_SECONDS / took)
    return max(GC_SWEEP_MIN_WINDOW, min(sized, 2 * span, GC_SWEEP_WINDOW))
