"""``queue schedules [list] | run NAME | forget NAME``: the schedules of
``SQLQUEUE["SCHEDULES"]``, one tick published now, or a removed schedule's row deleted."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from sqlqueue.naming import escape_controls


def schedules(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``forget``, ``run``, or (the default) ``list``."""
    if options.get("schedule_action") == "forget":
        _forget(out, options["name"])
    elif options.get("schedule_action") == "run":
        run_now(out, options["name"])
    else:
        list_schedules(out)


def _forget(out: OutputWrapper, name: str) -> None:
    from sqlqueue.operations.schedules import UnknownSchedule, forget_schedule

    try:
        forgotten = forget_schedule(name)
    except UnknownSchedule as error:
        raise CommandError(str(error)) from None
    if not forgotten:
        raise CommandError(f"No schedule {name!r} is stored.")
    out.write(f"Forgot schedule {name}.")


def run_now(out: OutputWrapper, name: str) -> None:
    from sqlqueue.operations.schedules import UnknownSchedule, run_schedule_now

    try:
        tick = run_schedule_now(name)
    except UnknownSchedule as error:
        raise CommandError(str(error)) from None
    out.write(f"Published a tick of {name}: message "
              f"{tick.message_id} at offset {tick.offset} on {tick.topic}.")


def list_schedules(out: OutputWrapper) -> None:
    from sqlqueue.operations.schedules import current_time_ms, schedule_overview

    views = schedule_overview(current_time_ms())
    if not views:
        out.write("No schedules (SQLQUEUE['SCHEDULES'] is empty).")
    for view in views:
        row = view.row
        last = (f"last tick {_when(row.last_tick)} (offset {row.last_offset})"
                if row and row.last_tick is not None else "no tick published yet")
        upcoming = (f"next {_when(view.next_tick_ms)}" if view.next_tick_ms is not None
                    else "publishes nothing")
        out.write(f"{escape_controls(view.name)}: {view.definition} -> "
                  f"{escape_controls(view.target)}; {upcoming}; {last}")
        for group, outcome in view.outcomes.items():
            out.write(f"    {escape_controls(group)}: {outcome}")


def _when(epoch_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="seconds")
