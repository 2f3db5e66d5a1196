"""Publishing due ticks from every ``runconsumer`` process, each tick exactly once.

Every process evaluates every schedule; there is no leader and no beat process. A
process that finds ticks due claims them with ``claim_ticks`` (a compare-and-set of the
schedule row's ``checked_until`` from the value it last read) and publishes them in the
same transaction: a second process claiming the same ticks changes nothing and publishes
nothing, and a process that dies before committing leaves the ticks to the others. The
message id of a tick is derived from (schedule, tick) as a second line of defence.

Missed ticks (no process ran, or the database was away): the newest ``catch_up`` of them
are published, the older ones skipped with a warning. A schedule seen for the first time
starts from now: it publishes no tick from before it existed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.publishing.api import send_message
from sqlqueue.scheduling.definitions import Schedule
from sqlqueue.scheduling.targets import target_for
from sqlqueue.storage.protocols import ScheduleStore
from sqlqueue.storage.sql.schedules import PublishedTick

logger = logging.getLogger("sqlqueue.schedules")

#: how soon a schedule is looked at again after a database error
RETRY_AFTER_ERROR_MS = 1000
#: how soon after an error of the schedule's own (its task raised) it is tried again
RETRY_AFTER_FAILURE_MS = 60_000
#: claims tried per look when other processes keep winning (they published: fine)
CLAIM_ATTEMPTS = 3


def alias_for(schedule: Schedule, conf: QueueSettings) -> str:
    """Where a schedule's row and messages live: its topic's database (``ROUTES``), or
    for a task the Tasks backend's (``SQLQUEUE["DATABASE"]``). One alias for both, so
    that the claim and the publish commit together."""
    if schedule.topic is not None:
        return conf.alias_for(schedule.topic)
    return conf.DATABASE


@dataclass
class Published:
    schedule: str
    ticks: list[int]
    skipped: int
    last: PublishedTick | None


def publish_tick(schedule: Schedule, tick_ms: int, alias: str) -> PublishedTick:
    """Publish one tick's message (or enqueue its task) on ``alias``, inside the caller's
    transaction."""
    if schedule.topic is not None:
        sent = send_message(
            schedule.topic, schedule.payload, id=schedule.message_id(tick_ms),
            partition_key=schedule.partition_key,
            metadata={**schedule.metadata, **tick_metadata(schedule, tick_ms)},
            priority=schedule.priority, using=alias,
        )
        return PublishedTick(tick_ms, sent.topic, sent.partition_key, sent.offset, sent.id)
    return target_for(schedule).enqueue(schedule, tick_ms, tick_metadata(schedule, tick_ms))


def tick_metadata(schedule: Schedule, tick_ms: int) -> dict[str, str]:
    return {"schedule": schedule.name, "tick": schedule.tick_label(tick_ms)}


class Ticker:
    """The schedules of one process: ``run_due()`` publishes what is due,
    ``next_due_ms()`` says when to call it again. ``clock``: the database's time in epoch
    milliseconds (every process must agree on it; ``DatabaseClock.now_ms``)."""

    def __init__(self, schedules: Iterable[Schedule], clock: Callable[[], int],
                 conf: QueueSettings | None = None) -> None:
        self.conf = conf or get_settings()
        self.schedules = {s.name: s for s in schedules}
        self.clock = clock
        #: the ``checked_until`` this process last read or wrote, per schedule
        self._checked: dict[str, int] = {}
        #: when each schedule needs a look next (epoch ms)
        self._due_at: dict[str, int] = dict.fromkeys(self.schedules, 0)

    def next_due_ms(self) -> int | None:
        return min(self._due_at.values()) if self._due_at else None

    def run_due(self) -> list[Published]:
        """Publish every due tick; a database error delays that schedule by a second and
        is logged (the consumers go on)."""
        done = []
        for name, schedule in self.schedules.items():
            now = self.clock()
            if self._due_at[name] > now:
                continue
            try:
                published = self._run(schedule, now)
            except AnyDatabaseError as exc:
                logger.warning("Schedule %s: could not publish its due tick(s) (%s); trying "
                               "again in %.0fs.", name, exc, RETRY_AFTER_ERROR_MS / 1000)
                self._retry_later(name, now, RETRY_AFTER_ERROR_MS)
                continue
            except Exception:
                # A broken task or payload must not stop the consumers of this process.
                logger.exception("Schedule %s: publishing its due tick(s) failed; trying "
                                 "again in %.0fs.", name, RETRY_AFTER_FAILURE_MS / 1000)
                self._retry_later(name, now, RETRY_AFTER_FAILURE_MS)
                continue
            if published is not None:
                done.append(published)
        return done

    def _retry_later(self, name: str, now: int, delay_ms: int) -> None:
        self._checked.pop(name, None)  # read the row again: the transaction rolled back
        self._due_at[name] = now + delay_ms

    # -- one schedule ---------------------------------------------------------------------
    def _run(self, schedule: Schedule, now: int) -> Published | None:
        alias = alias_for(schedule, self.conf)
        connection = connections[alias]
        store = storage.store(connection)
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            for _ in range(CLAIM_ATTEMPTS):
                seen = self._checked.get(schedule.name)
                if seen is None:
                    seen = self._read(cursor, store, schedule, now)
                due = schedule.due_ticks(seen, now)
                if not due:
                    self._wait_for_next(schedule, seen)
                    return None
                if store.claim_ticks(cursor, schedule.name, seen, due[-1],
                                       schedule.definition):
                    published = self._publish(schedule, due, alias)
                    if published.last is not None:
                        store.record_tick(cursor, schedule.name, published.last)
                    break
                self._checked.pop(schedule.name, None)  # another process was first
            else:
                self._retry_later(schedule.name, now, RETRY_AFTER_ERROR_MS)
                return None
        # Committed: only now are the ticks this process's view.
        self._checked[schedule.name] = due[-1]
        self._wait_for_next(schedule, due[-1])
        self._log(published)
        return published

    def _read(self, cursor: Any, store: ScheduleStore, schedule: Schedule, now: int) -> int:
        """The row's ``checked_until``, newest committed value. The row is written first
        (created if missing, starting now: no tick from before the schedule existed):
        the write takes the row's lock at once, so that two processes reading it at the
        same moment queue up instead of deadlocking, and the read that follows (a
        locking read) sees what the other committed."""
        store.ensure_schedules(cursor, [(schedule.name, now, schedule.definition)])
        rows = store.read_schedules(cursor, [schedule.name], lock=True)
        return int(rows[schedule.name].checked_until)

    def _publish(self, schedule: Schedule, due: list[int], alias: str) -> Published:
        ticks = due[-schedule.catch_up:]
        last = None
        for tick in ticks:
            last = publish_tick(schedule, tick, alias)
        return Published(schedule.name, ticks, len(due) - len(ticks), last)

    def _wait_for_next(self, schedule: Schedule, checked: int) -> None:
        tick = schedule.next_tick(checked)
        self._due_at[schedule.name] = tick + schedule.jitter_for(tick)

    @staticmethod
    def _log(published: Published) -> None:
        if published.skipped:
            logger.warning("Schedule %s: %s missed tick(s) skipped (catch_up keeps the "
                           "newest %s).", published.schedule, published.skipped,
                           len(published.ticks))
        for tick in published.ticks:
            logger.info("Schedule %s: published the tick of %s.", published.schedule, tick)
