"""Schedules: periodic messages and Django tasks, each tick published exactly once by
whichever ``runconsumer`` processes run, with no beat process (docs/guides/schedules.md).

Layout: ``definitions`` parses ``SQLQUEUE["SCHEDULES"]`` and computes ticks (pure);
``validation`` checks what needs Django (topics, payloads, tasks); ``ticker`` claims and
publishes due ticks. Operators see schedules through ``sqlqueue.operations.schedules``.
"""

from __future__ import annotations

from sqlqueue.conf import QueueSettings, get_settings
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.scheduling.definitions import Schedule, ScheduleError, parse_schedules

__all__ = ["Schedule", "ScheduleError", "configured_schedules"]


def configured_schedules(conf: QueueSettings | None = None) -> list[Schedule]:
    """The schedules of ``SQLQUEUE["SCHEDULES"]``; ``ConfigurationError`` naming every
    problem if any entry is unusable (``manage.py check`` reports them with their ids)."""
    conf = conf or get_settings()
    schedules, errors = parse_schedules(dict(conf.SCHEDULES))
    if errors:
        details = "; ".join(f"{error} ({error.check_id})" for error in errors)
        raise ConfigurationError(f"Invalid SQLQUEUE['SCHEDULES']: {details}")
    return schedules
