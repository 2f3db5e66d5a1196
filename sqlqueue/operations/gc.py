"""Garbage collection now, for operators (``manage.py queue gc``): what ``runconsumer``
does every few seconds, run to the end in batches. Each run writes how far it got to
``queue_gc_runs`` as it goes (``CollectionRun``), which the admin's live overview shows
(``collection_runs``): a deep collection takes minutes, and the operator who finds the
database busy sees who is deleting, how far it got and how fast."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.conf import get_settings
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.models import CollectionRun
from sqlqueue.operations.lag import known_subscriptions

#: a running collection writes its row at most this often (seconds of its own clock)
RECORD_INTERVAL = 2.0
#: an unfinished run whose row was not written for this long stopped (killed, or failed)
SILENT_AFTER_MS = 60_000
#: finished runs are forgotten after this long (ms), by the next run
KEPT_MS = 7 * 24 * 3600 * 1000
#: runs the admin shows at most, the newest first
RUNS_SHOWN = 5


@dataclass(frozen=True)
class Collected:
    messages: int  # every known group had finished them
    task_results: int  # older than their backend's RESULT_RETENTION
    idempotency_keys: int  # past IDEMPOTENCY_WINDOW


@dataclass(frozen=True)
class CollectionReport:
    """A run of ``queue gc`` as the admin shows it (times: epoch ms of its host)."""

    collector: str  # the command, its host and process id
    database: str
    started_ms: int
    updated_ms: int  # its last word
    finished_ms: int  # 0: not finished
    messages: int  # rows of the log deleted so far
    share: float  # the part of its time spent deleting (``--share``)
    now_ms: int  # when this report was read

    @property
    def state(self) -> str:
        """``running``, ``finished``, or ``silent``: unfinished, and no word for
        ``SILENT_AFTER_MS`` (killed, or it failed)."""
        if self.finished_ms:
            return "finished"
        return "silent" if self.now_ms - self.updated_ms > SILENT_AFTER_MS else "running"

    @property
    def seconds(self) -> float:
        return max((self.finished_ms or self.updated_ms) - self.started_ms, 0) / 1000

    @property
    def rows_per_second(self) -> float | None:
        return self.messages / self.seconds if self.seconds > 0 else None


def collector_name() -> str:
    """How a run of ``queue gc`` names itself: the command, the host, the process."""
    return f"queue gc on {socket.gethostname()} (pid {os.getpid()})"


def collect_garbage(progress: Callable[[int], None] | None = None,
                    using: str | None = None, share: float = 1.0,
                    host_clock: HostClock = SYSTEM_CLOCK,
                    collector: str | None = None) -> Collected:
    """Delete, batch by batch until none is left, what garbage collection may delete, in
    the database ``using`` (None: every database the queue lives in, ``SQLQUEUE["DATABASE"]``
    and the aliases of ``ROUTES``); ``progress`` is told the running total after each
    batch. ``share`` (0 < share <= 1): the part of the time spent deleting; after each
    batch it pauses for as long as the batch took times ``1 / share - 1``, so that live
    traffic beside a deep collection keeps its latency (issue 52). ``host_clock`` times
    the batches and pauses (a test passes a manual one). The run is written to each
    database's ``queue_gc_runs`` as ``collector`` (None: ``collector_name()``)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be above 0 and at most 1, not {share!r}")
    conf = get_settings()
    total = Collected(0, 0, 0)
    for alias in [using] if using else conf.databases:
        record = _Record(alias, collector or collector_name(), share, host_clock)
        done = _collect_in(alias, progress, total.messages, share, host_clock, record)
        total = Collected(total.messages + done.messages,
                          total.task_results + done.task_results,
                          total.idempotency_keys + done.idempotency_keys)
    return total


def _collect_in(alias: str, progress: Callable[[int], None] | None,
                before: int, share: float, host_clock: HostClock,
                record: _Record) -> Collected:
    topics: dict[str, set[str]] = {}
    for group, topic in known_subscriptions(alias):
        topics.setdefault(topic, set()).add(group)
    collector = GarbageCollector(get_settings(), alias, topics)
    total = before
    with connections[alias].cursor() as cursor:
        while True:
            began = host_clock.monotonic()
            removed = collector.collect(cursor, force=True)
            if not removed:
                break
            total += removed
            if progress is not None:
                progress(total)
            ended = host_clock.monotonic()
            record.progress(collector.deleted, ended)
            if share < 1:
                host_clock.sleep((ended - began) * (1 / share - 1))
    record.finish(collector.deleted)
    return Collected(collector.deleted, collector.results_deleted, collector.keys_deleted)


class _Record:
    """A run's row of ``queue_gc_runs``: written at its start, at most every
    ``RECORD_INTERVAL`` as it goes, and at its end (with the runs older than
    ``KEPT_MS`` deleted)."""

    def __init__(self, alias: str, collector: str, share: float,
                 host_clock: HostClock) -> None:
        self.runs = CollectionRun.objects.using(alias)
        self.collector = collector
        self.host_clock = host_clock
        self.written = host_clock.monotonic()
        now = self._now_ms()
        self.runs.filter(updated_at__lt=now - KEPT_MS).delete()
        self.runs.update_or_create(collector=collector, defaults={
            "started_at": now, "updated_at": now, "finished_at": 0, "messages": 0,
            "share": share})

    def _now_ms(self) -> int:
        return int(self.host_clock.wall() * 1000)

    def progress(self, messages: int, now: float) -> None:
        if now - self.written >= RECORD_INTERVAL:
            self.written = now
            self.runs.filter(collector=self.collector).update(
                messages=messages, updated_at=self._now_ms())

    def finish(self, messages: int) -> None:
        now = self._now_ms()
        self.runs.filter(collector=self.collector).update(
            messages=messages, updated_at=now, finished_at=now)


def collection_runs(using: str | None = None,
                    host_clock: HostClock = SYSTEM_CLOCK) -> list[CollectionReport]:
    """The runs of ``queue gc`` in the database ``using`` (None: every database the
    queue lives in), running ones first, then the newest; at most ``RUNS_SHOWN`` a
    database. One read of the small ``queue_gc_runs`` each."""
    conf = get_settings()
    now = int(host_clock.wall() * 1000)
    reports = []
    for alias in [using] if using else conf.databases:
        rows = (CollectionRun.objects.using(conf.read_alias(alias))
                .order_by("-updated_at")[:RUNS_SHOWN])
        reports += [CollectionReport(row.collector, alias, row.started_at, row.updated_at,
                                     row.finished_at, row.messages, row.share, now)
                    for row in rows]
    return sorted(reports, key=lambda r: (r.state != "running", -r.updated_ms))
