"""Schedules kept in the database (issue 42; ``sqlqueue.scheduling.stored``): checked,
saved, paused and resumed for the admin. Running one now is
``sqlqueue.operations.schedules.run_schedule_now``, as for the setting's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import ScheduleState, StoredSchedule
from sqlqueue.scheduling import Schedule
from sqlqueue.scheduling import ScheduleError as ScheduleError  # what the admin's form reports
from sqlqueue.scheduling.definitions import parse_schedule
from sqlqueue.scheduling.stored import checked_schedule
from sqlqueue.scheduling.targets import target_choices


def check_stored_schedule(name: Any, entry: Any) -> Schedule:
    """The schedule ``entry`` describes, or ``ScheduleError`` saying what is wrong with it
    in words for the form that edits it (not the setting's)."""
    try:
        return checked_schedule(name, entry)
    except ScheduleError as error:
        text = str(error).replace(f"SQLQUEUE['SCHEDULES'][{name!r}]", "This schedule")
        raise ScheduleError(error.check_id, text, error.key) from error


def schedulable_tasks() -> list[str]:
    """The paths of the registered ``@task``s a stored schedule may enqueue (sqlqueue's
    Tasks backends'), sorted: the form's choices. Nothing typed is ever imported."""
    return target_choices("task")


def schedule_definition(name: str, entry: Any) -> str:
    """How a stored schedule reads (its cron line or interval), or "" if it no longer
    parses."""
    try:
        return parse_schedule(name, entry).definition
    except ScheduleError:
        return ""


def save_stored_schedule(name: str, entry: dict[str, Any], *, paused: bool = False,
                         by: str = "") -> StoredSchedule:
    """Create or replace a stored schedule, checked first. Runners take it up within
    ``RELOAD_INTERVAL_MS``; an edited one goes on from its last published tick."""
    schedule = check_stored_schedule(name, entry)
    alias = get_settings().DATABASE
    with transaction.atomic(using=alias):
        stored, _ = StoredSchedule.objects.using(alias).update_or_create(
            name=schedule.name, defaults={"entry": entry, "paused": paused,
                                          "changed_by": by[:255]})
    return stored


def set_paused(names: Iterable[str], paused: bool, *, by: str = "") -> int:
    """Pause or resume stored schedules; returns how many changed. A resumed schedule
    starts from now: the ticks it missed while paused are not published (its row's
    ``checked_until`` moves to now, in the same transaction)."""
    alias = get_settings().DATABASE
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        changing = list(StoredSchedule.objects.using(alias).select_for_update()
                        .filter(name__in=list(names)).exclude(paused=paused)
                        .values_list("name", flat=True))
        StoredSchedule.objects.using(alias).filter(name__in=changing).update(
            paused=paused, changed_by=by[:255])
        if not paused and changing:
            now = storage.store(connection).database_now_ms(cursor)
            ScheduleState.objects.using(alias).filter(
                name__in=changing, checked_until__lt=now).update(checked_until=now)
    return len(changing)
