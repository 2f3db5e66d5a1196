"""Where a schedule's tick goes when it names no topic: a target registered by the
integration that owns it (the Django Tasks backend registers ``"task"``), so scheduling
imports nothing above it, as garbage collection reaches task results through
``register_collection``."""

from __future__ import annotations

from typing import Protocol

from sqlqueue.scheduling.definitions import Schedule, ScheduleError
from sqlqueue.storage.statements.schedules import PublishedTick


class TickTarget(Protocol):
    def check(self, schedule: Schedule) -> None:
        """Raise ``ScheduleError`` (with its check id) if ``schedule``'s ticks cannot
        be delivered here. Never imports a module the schedule names: it looks the
        target up among those the project defined."""

    def enqueue(self, schedule: Schedule, tick_ms: int,
                metadata: dict[str, str]) -> PublishedTick:
        """Deliver one tick inside the caller's transaction; what was stored."""

    def choices(self) -> list[str]:
        """Every value a schedule may name here (the registered tasks' paths), sorted:
        what a stored schedule's form offers."""

    def owns_topic(self, topic: str) -> bool:
        """Whether messages on ``topic`` are this target's own (a Tasks backend's
        queues): a stored schedule may not publish there by hand."""


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
            f"{kind}s (is sqlqueue in INSTALLED_APPS and its app ready?)", kind) from None


def target_choices(kind: str = "task") -> list[str]:
    """What a schedule may name as its ``kind`` (no target registered: nothing)."""
    target = _targets.get(kind)
    return target.choices() if target is not None else []


def owning_target(topic: str) -> str | None:
    """The kind of the target whose own topic ``topic`` is (``"task"`` for a Tasks
    backend's queue), or None."""
    return next((kind for kind, target in _targets.items() if target.owns_topic(topic)),
                None)
