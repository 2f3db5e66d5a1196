"""Garbage collection now, for operators (``manage.py queue gc``): what ``runconsumer``
does every few seconds, run to the end in batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.conf import get_settings
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.operations.lag import known_subscriptions


@dataclass(frozen=True)
class Collected:
    messages: int  # every known group had finished them
    task_results: int  # older than their backend's RESULT_RETENTION
    idempotency_keys: int  # past IDEMPOTENCY_WINDOW


def collect_garbage(progress: Callable[[int], None] | None = None,
                    using: str | None = None, share: float = 1.0,
                    host_clock: HostClock = SYSTEM_CLOCK) -> Collected:
    """Delete, batch by batch until none is left, what garbage collection may delete, in
    the database ``using`` (None: every database the queue lives in, ``SQLQUEUE["DATABASE"]``
    and the aliases of ``ROUTES``); ``progress`` is told the running total after each
    batch. ``share`` (0 < share <= 1): the part of the time spent deleting; after each
    batch it pauses for as long as the batch took times ``1 / share - 1``, so that live
    traffic beside a deep collection keeps its latency (issue 52). ``host_clock`` times
    the batches and pauses (a test passes a manual one)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be above 0 and at most 1, not {share!r}")
    conf = get_settings()
    total = Collected(0, 0, 0)
    for alias in [using] if using else conf.databases:
        done = _collect_in(alias, progress, total.messages, share, host_clock)
        total = Collected(total.messages + done.messages,
                          total.task_results + done.task_results,
                          total.idempotency_keys + done.idempotency_keys)
    return total


def _collect_in(alias: str, progress: Callable[[int], None] | None,
                before: int, share: float, host_clock: HostClock) -> Collected:
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
            if share < 1:
                host_clock.sleep((host_clock.monotonic() - began) * (1 / share - 1))
    return Collected(collector.deleted, collector.results_deleted, collector.keys_deleted)
