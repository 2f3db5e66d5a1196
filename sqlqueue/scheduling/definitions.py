"""``SQLQUEUE["SCHEDULES"]``: each entry parsed into a ``Schedule``, with a check id for
everything wrong with it (docs/guides/schedules.md, "What a schedule takes").

Pure: no database, no clock. Times are epoch milliseconds (UTC); a ``cron`` schedule's
fields are read in its ``timezone``.

Ticks
    ``every`` N seconds: the multiples of N seconds since the Unix epoch, so every process
    computes the same ticks without talking to the others. ``cron``: the times croniter
    gives for the expression in the time zone, with one rule for daylight saving time:
    a local time that does not exist (clocks go forward) runs once at the next valid
    minute (croniter's behaviour), and a local time that exists twice (clocks go back)
    runs once, at its first occurrence.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.naming import MAX_JSON_DEPTH, check_name
from sqlqueue.publishing.messages import DEFAULT_PRIORITY, nesting

KNOWN_KEYS = frozenset({
    "topic", "payload", "partition_key", "priority", "metadata", "task", "args", "kwargs",
    "every", "cron", "timezone", "jitter", "catch_up",
})
#: the shortest interval of an ``every`` schedule
MIN_EVERY_SECONDS = 1
#: the longest ``every`` and ``jitter`` (ten years): a longer one is a typing mistake, and
#: its ticks would leave the years a datetime can hold (the tick's message id)
MAX_INTERVAL_SECONDS = 10 * 365 * 86400
#: how many missed ticks ``catch_up`` may ask for at most
MAX_CATCH_UP = 1000
#: metadata keys the schedule sets on each message
RESERVED_METADATA = ("schedule", "tick")


class ScheduleError(SqlqueueError, ValueError):
    """One thing wrong with one schedule; ``check_id`` is its system check id, ``key`` the
    entry's key it is about (None: the entry as a whole), so that a form shows the error
    beside that field."""

    def __init__(self, check_id: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.check_id = check_id
        self.key = key


@dataclass(frozen=True)
class Schedule:
    """One parsed entry of ``SQLQUEUE["SCHEDULES"]``."""

    name: str
    every_ms: int | None = None
    cron: str | None = None
    timezone: str = "UTC"
    topic: str | None = None  # a message schedule
    payload: Any = None
    partition_key: str | None = None
    priority: int = DEFAULT_PRIORITY
    metadata: Mapping[str, str] = field(default_factory=dict)
    task: str | None = None  # a Django task schedule: the task's dotted path
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    jitter_ms: int = 0
    catch_up: int = 1

    @property
    def definition(self) -> str:
        """The timing as one line (stored with the schedule's row, shown to operators)."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        return f"every {(self.every_ms or 0) / 1000:g}s"

    # -- ticks ------------------------------------------------------------------------------
    def ticks_after(self, after_ms: int) -> Iterator[int]:
        """The ticks later than ``after_ms``, in order (endless)."""
        if self.every_ms is not None:
            tick = (after_ms // self.every_ms + 1) * self.every_ms
            while True:
                yield tick
                tick += self.every_ms
        else:
            yield from _cron_ticks(self._cron_expression(), self._zone(), after_ms)

    def next_tick(self, after_ms: int) -> int:
        return next(self.ticks_after(after_ms))

    def due_ticks(self, after_ms: int, now_ms: int) -> list[int]:
        """The ticks later than ``after_ms`` whose time (plus jitter) has come by
        ``now_ms``, oldest first. A tick whose jitter holds it back holds back the ticks
        after it too, so that none is skipped. At most ``MAX_CATCH_UP + 1`` of the
        newest are kept: older ones would be skipped anyway."""
        due: list[int] = []
        start = after_ms
        if self.every_ms is not None and now_ms - after_ms > (MAX_CATCH_UP + 2) * self.every_ms:
            # A long outage: start near the end instead of walking every missed tick.
            start = now_ms - (MAX_CATCH_UP + 2) * self.every_ms
        for tick in self.ticks_after(start):
            if tick > now_ms or tick + self.jitter_for(tick) > now_ms:
                break
            due.append(tick)
            if len(due) > 2 * (MAX_CATCH_UP + 1):
                del due[: MAX_CATCH_UP + 1]
        return due[-(MAX_CATCH_UP + 1):]

    def jitter_for(self, tick_ms: int) -> int:
        """The delay of ``tick_ms``'s publish, in [0, jitter]: the same in every process
        (derived from the name and the tick), different from tick to tick."""
        if not self.jitter_ms:
            return 0
        digest = hashlib.sha256(f"{self.name}:{tick_ms}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % (self.jitter_ms + 1)

    def tick_label(self, tick_ms: int) -> str:
        """The tick's ISO time: in the schedule's time zone for cron, UTC otherwise."""
        moment = datetime.fromtimestamp(tick_ms / 1000, tz=UTC)
        if self.cron is not None:
            moment = moment.astimezone(self._zone())
        return moment.isoformat()

    def message_id(self, tick_ms: int) -> str:
        """The id of the tick's message: the same in every process, so that publishing a
        tick twice (a retried transaction) stores it once."""
        stamp = datetime.fromtimestamp(tick_ms / 1000, tz=UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        return f"schedule:{self.name}:{stamp}"

    def _zone(self) -> tzinfo:
        return ZoneInfo(self.timezone)

    def _cron_expression(self) -> str:
        assert self.cron is not None
        return self.cron


def _cron_ticks(expression: str, zone: tzinfo, after_ms: int) -> Iterator[int]:
    from croniter import croniter

    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(zone)
    series = croniter(expression, start)
    while True:
        moment: datetime = series.get_next(datetime)
        if _is_repeated_local_time(moment, zone):
            continue  # clocks went back: this wall time already ran at its first occurrence
        tick = round(moment.timestamp() * 1000)
        if tick > after_ms:
            yield tick


def _is_repeated_local_time(moment: datetime, zone: tzinfo) -> bool:
    """Whether ``moment`` is the second occurrence of a local time that exists twice."""
    wall = moment.replace(tzinfo=None)
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return False
    return moment.utcoffset() == second.utcoffset() != first.utcoffset()


# -- parsing ---------------------------------------------------------------------------------

def parse_schedules(raw: Any) -> tuple[list[Schedule], list[ScheduleError]]:
    """Every entry of ``SQLQUEUE["SCHEDULES"]``: the usable ones and the errors."""
    if raw is None:
        return [], []
    if not isinstance(raw, Mapping):
        return [], [ScheduleError(
            "sqlqueue.E301",
            f"SQLQUEUE['SCHEDULES'] must be a dict of name to schedule, not "
            f"{type(raw).__name__}.")]
    schedules: list[Schedule] = []
    errors: list[ScheduleError] = []
    for name, entry in raw.items():
        try:
            schedules.append(parse_schedule(name, entry))
        except ScheduleError as error:
            errors.append(error)
    return schedules, errors


def parse_schedule(name: Any, entry: Any) -> Schedule:
    """One entry; raises ``ScheduleError`` naming the first problem."""
    try:
        name = check_name("schedule name", name)
    except ValueError as exc:
        raise ScheduleError("sqlqueue.E301", f"SQLQUEUE['SCHEDULES']: {exc}", "name") from exc
    where = f"SQLQUEUE['SCHEDULES'][{name!r}]"
    if not isinstance(entry, Mapping):
        raise ScheduleError("sqlqueue.E301", f"{where} must be a dict, not "
                                             f"{type(entry).__name__}.")
    unknown = sorted(set(map(str, entry)) - KNOWN_KEYS)
    if unknown:
        raise ScheduleError("sqlqueue.E302", f"{where} has unknown key(s) {', '.join(unknown)}; "
                                             f"known: {', '.join(sorted(KNOWN_KEYS))}.")
    timing = _timing(where, entry)
    target = _target(where, entry)
    return Schedule(name=name, **timing, **target, jitter_ms=_jitter(where, entry),
                    catch_up=_catch_up(where, entry))


def _timing(where: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    every, cron = entry.get("every"), entry.get("cron")
    if (every is None) == (cron is None):
        raise ScheduleError("sqlqueue.E303", f"{where} needs exactly one of 'every' (seconds) "
                                             "and 'cron' (an expression).", "every")
    if every is not None:
        if "timezone" in entry:
            raise ScheduleError("sqlqueue.E303", f"{where}: 'timezone' applies to 'cron' only "
                                                 "('every' counts seconds since the epoch).",
                                "timezone")
        seconds = _seconds(every)
        if seconds is None or not MIN_EVERY_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
            raise ScheduleError("sqlqueue.E304", f"{where}['every'] must be a number of seconds "
                                                 f"from {MIN_EVERY_SECONDS} to "
                                                 f"{MAX_INTERVAL_SECONDS:,} (ten years); got "
                                                 f"{_shown(every)}.", "every")
        return {"every_ms": round(seconds * 1000)}
    zone = entry.get("timezone", "UTC")
    try:
        if not isinstance(zone, str):
            raise ValueError
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a name too long
        shown = zone if not isinstance(zone, str) or len(zone) <= 80 else zone[:80] + "..."
        raise ScheduleError("sqlqueue.E306", f"{where}['timezone'] {shown!r} is not a known "
                                             "time zone (an IANA name such as "
                                             "'Europe/Paris').", "timezone") from exc
    expression = _cron(where, cron)
    _check_cron_fires(where, expression, zone)
    return {"cron": expression, "timezone": zone}


def _cron(where: str, cron: Any) -> str:
    from croniter import croniter

    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise ScheduleError("sqlqueue.E305", f"{where}['cron'] {cron!r} is not a 5-field cron "
                                             "expression (minute hour day-of-month month "
                                             "day-of-week).", "cron")
    return " ".join(cron.split())


def _check_cron_fires(where: str, expression: str, zone: str) -> None:
    """A valid expression may name a day that never comes (``0 0 30 2 *``): croniter
    then gives up searching for it. Such a schedule would never tick, and every page
    that shows its next tick would fail: refused here."""
    from croniter import CroniterError

    try:
        next(_cron_ticks(expression, ZoneInfo(zone), 0))
    except (CroniterError, ValueError, OverflowError) as exc:
        raise ScheduleError("sqlqueue.E305", f"{where}['cron'] {expression!r} never fires "
                                             f"(no such date: {exc}).", "cron") from exc


def _shown(value: Any) -> str:
    """A refused value for an error message: a huge number briefly (``1e+308``, not its
    309 digits), anything else as its repr, cut at 80 characters."""
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > 1e15:
        try:
            return f"{float(value):g}"
        except OverflowError:
            return "a number of more than 300 digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _seconds(value: Any) -> float | None:
    from datetime import timedelta

    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        return None


def _target(where: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    topic, task = entry.get("topic"), entry.get("task")
    if (topic is None) == (task is None):
        raise ScheduleError("sqlqueue.E307", f"{where} needs exactly one of 'topic' (publish a "
                                             "message) and 'task' (enqueue a Django task).",
                            "topic")
    if topic is not None:
        for key in ("args", "kwargs"):
            if key in entry:
                raise ScheduleError("sqlqueue.E307", f"{where}: {key!r} applies to 'task' "
                                                     "schedules; use 'payload'.", key)
        return {"topic": topic, "payload": entry.get("payload"),
                "partition_key": entry.get("partition_key"),
                "priority": entry.get("priority", DEFAULT_PRIORITY),
                "metadata": _metadata(where, entry)}
    for key in ("payload", "partition_key", "priority", "metadata"):
        if key in entry:
            raise ScheduleError("sqlqueue.E307", f"{where}: {key!r} applies to 'topic' "
                                                 "schedules; a task's options come from its "
                                                 "@task decorator.", key)
    if not isinstance(task, str) or "." not in task:
        raise ScheduleError("sqlqueue.E308", f"{where}['task'] must be the dotted path of a "
                                             f"Django @task; got {task!r}.", "task")
    args, kwargs = entry.get("args", ()), entry.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise ScheduleError("sqlqueue.E309", f"{where}: 'args' must be a list and 'kwargs' a "
                                             "dict.", "args" if not isinstance(
                                                 args, list | tuple) else "kwargs")
    _json(where, "args", list(args))
    _json(where, "kwargs", dict(kwargs))
    return {"task": task, "args": tuple(args), "kwargs": dict(kwargs)}


def _metadata(where: str, entry: Mapping[str, Any]) -> dict[str, str]:
    metadata = entry.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ScheduleError("sqlqueue.E309", f"{where}['metadata'] must be a dict of strings.",
                            "metadata")
    taken = sorted(set(metadata) & set(RESERVED_METADATA))
    if taken:
        raise ScheduleError("sqlqueue.E309", f"{where}['metadata'] may not set "
                                             f"{', '.join(taken)}: the schedule sets them.",
                            "metadata")
    return dict(metadata)


def _json(where: str, key: str, value: Any) -> None:
    """``value`` (the task's args or kwargs) is JSON a message can carry: its depth is
    measured without recursion first, so that a value nested 100,000 deep is a refusal,
    not a RecursionError."""
    if nesting(value) > MAX_JSON_DEPTH:
        raise ScheduleError("sqlqueue.E309", f"{where}: {key} nests lists and objects more "
                                             f"than {MAX_JSON_DEPTH} deep.", key)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ScheduleError("sqlqueue.E309", f"{where}: {key} is not JSON: {exc}.",
                            key) from exc


def _jitter(where: str, entry: Mapping[str, Any]) -> int:
    if "jitter" not in entry:
        return 0
    seconds = _seconds(entry["jitter"])
    if seconds is None or not 0 <= seconds <= MAX_INTERVAL_SECONDS:
        raise ScheduleError("sqlqueue.E304", f"{where}['jitter'] must be a number of seconds "
                                             f"from 0 to {MAX_INTERVAL_SECONDS:,} (ten years); "
                                             f"got {_shown(entry['jitter'])}.", "jitter")
    return round(seconds * 1000)


def _catch_up(where: str, entry: Mapping[str, Any]) -> int:
    value = entry.get("catch_up", 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CATCH_UP:
        raise ScheduleError("sqlqueue.E304", f"{where}['catch_up'] must be an integer from 1 "
                                             f"to {MAX_CATCH_UP}; got {_shown(value)}.", "catch_up")
    return value
