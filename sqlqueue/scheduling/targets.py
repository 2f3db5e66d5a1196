"""Where a schedule's tick goes when it names no topic: a target registered by the
integration that owns it (the Django Tasks backend registers ``"task"``), so scheduling
imports nothing above it, as garbage collection reaches task results through
``register_pruner``."""

from __future__ import annotations

from typing import Protocol

from sqlqueue.scheduling.definitions import Schedule, ScheduleError
from sqlqueue.storage.statements.schedules import PublishedTick


class TickTarget(Protocol):
    def check(self, schedule: Schedule) -> None:
        """Raise ``ScheduleError`` (with its check id) if ``schedule``'s ticks cannot
        be delivered here."""

    def enqueue(self, schedule: Schedule, tick_ms: int,
                metadata: dict[str, str]) -> PublishedTick:
        """Deliver one tick inside the caller's transaction; what was stored."""


_targets: dict[str, TickTarget] = {}


def register_target(kind: str, target: TickTarget) -> None:
    """Have schedules of ``kind`` (the key naming it in the entry, e.g. ``"task"``)
    delivered by ``target`` (the last registration wins)."""
    _targets[kind] = target


def target_for(schedule: Schedule, kind: str = "task") -> TickTarget:
    try:
        return _targets[kind]
    except KeyError:
        raise ScheduleError(
            "sqlqueue.E308",
            f"SQLQUEUE['SCHEDULES'][{schedule.name!r}]['{kind}']: nothing delivers "
            f"{kind}s (is sqlqueue in INSTALLED_APPS and its app ready?)") from None
