"""SQLQUEUE["SCHEDULES"] entries: parsing, check ids, and the ticks they give on a fixed
clock (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sqlqueue.scheduling.definitions import (
    MAX_CATCH_UP,
    Schedule,
    ScheduleError,
    parse_schedule,
    parse_schedules,
)

PARIS = ZoneInfo("Europe/Paris")


def ms(*args: int, tz: Any = UTC) -> int:
    return round(datetime(*args, tzinfo=tz).timestamp() * 1000)


def local(tick_ms: int, tz: Any = PARIS) -> str:
    return datetime.fromtimestamp(tick_ms / 1000, tz=tz).isoformat()


# -- every ---------------------------------------------------------------------------------

def test_every_ticks_at_multiples_of_the_interval_since_the_epoch() -> None:
    schedule = parse_schedule("s", {"topic": "t", "every": 60})
    after = ms(2026, 11, 23, 10, 0, 30)
    assert schedule.next_tick(after) == ms(2026, 11, 23, 10, 1)
    # A tick is never "after" itself: the one at 10:01 is followed by 10:02.
    assert schedule.next_tick(ms(2026, 11, 23, 10, 1)) == ms(2026, 11, 23, 10, 2)


def test_due_ticks_are_those_whose_time_has_come() -> None:
    schedule = parse_schedule("s", {"topic": "t", "every": 10})
    start = ms(2026, 1, 1, 0, 0, 0)
    assert schedule.due_ticks(start, start + 9_999) == []
    assert schedule.due_ticks(start, start + 10_000) == [start + 10_000]
    assert schedule.due_ticks(start, start + 35_000) == [start + 10_000, start + 20_000,
                                                         start + 30_000]


def test_a_long_outage_keeps_only_the_newest_ticks_without_walking_them_all() -> None:
    schedule = parse_schedule("s", {"topic": "t", "every": 1})
    start = ms(2020, 1, 1)
    now = ms(2026, 1, 1)  # six years of one-second ticks
    due = schedule.due_ticks(start, now)
    assert len(due) == MAX_CATCH_UP + 1
    assert due[-1] == now
    assert due == sorted(due)


def test_jitter_is_the_same_in_every_process_and_within_its_bound() -> None:
    schedule = parse_schedule("s", {"topic": "t", "every": 60, "jitter": 30})
    again = parse_schedule("s", {"topic": "t", "every": 60, "jitter": 30})
    ticks = [ms(2026, 1, 1) + n * 60_000 for n in range(1, 200)]
    delays = [schedule.jitter_for(t) for t in ticks]
    assert delays == [again.jitter_for(t) for t in ticks]
    assert all(0 <= d <= 30_000 for d in delays)
    assert len(set(delays)) > 100  # spread, not one fixed offset


def test_a_tick_held_back_by_its_jitter_holds_back_the_later_ones() -> None:
    schedule = parse_schedule("s", {"topic": "t", "every": 1, "jitter": 5})
    start = ms(2026, 1, 1)
    now = start + 10_000
    due = schedule.due_ticks(start, now)
    # Every tick returned is due, and it is a prefix: nothing after a held-back tick.
    assert all(t + schedule.jitter_for(t) <= now for t in due)
    expected = []
    for n in range(1, 11):
        tick = start + n * 1000
        if tick + schedule.jitter_for(tick) > now:
            break
        expected.append(tick)
    assert due == expected


def test_the_message_id_and_the_tick_label_name_the_tick() -> None:
    every = parse_schedule("nightly", {"topic": "t", "every": 60})
    tick = ms(2026, 11, 23, 3, 0)
    assert every.message_id(tick) == "schedule:nightly:20261123T030000.000000Z"
    assert every.tick_label(tick) == "2026-11-23T03:00:00+00:00"
    cron = parse_schedule("paris", {"topic": "t", "cron": "0 3 * * *",
                                    "timezone": "Europe/Paris"})
    assert cron.tick_label(ms(2026, 11, 23, 3, 0, tz=PARIS)) == "2026-11-23T03:00:00+01:00"


# -- cron --------------------------------------------------------------------------------------

def test_cron_ticks_in_the_schedules_time_zone() -> None:
    schedule = parse_schedule("s", {"topic": "t", "cron": "30 9 * * 1-5",
                                    "timezone": "Europe/Paris"})
    friday_evening = ms(2026, 11, 20, 18, 0, tz=PARIS)
    monday = schedule.next_tick(friday_evening)
    assert local(monday) == "2026-11-23T09:30:00+01:00"


def test_cron_a_skipped_local_time_runs_once_at_the_next_valid_minute() -> None:
    # 2026-03-29: Paris clocks go from 02:00 to 03:00; 02:30 does not exist.
    schedule = parse_schedule("s", {"topic": "t", "cron": "30 2 * * *",
                                    "timezone": "Europe/Paris"})
    ticks = schedule.ticks_after(ms(2026, 3, 27, 12, 0, tz=PARIS))
    got = [local(next(ticks)) for _ in range(4)]
    assert got == ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00",
                   "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]


def test_cron_a_repeated_local_time_runs_once() -> None:
    # 2026-10-25: Paris clocks go back from 03:00 to 02:00; 02:30 happens twice.
    schedule = parse_schedule("s", {"topic": "t", "cron": "30 2 * * *",
                                    "timezone": "Europe/Paris"})
    ticks = schedule.ticks_after(ms(2026, 10, 23, 12, 0, tz=PARIS))
    got = [local(next(ticks)) for _ in range(3)]
    assert got == ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00",
                   "2026-10-26T02:30:00+01:00"]


def test_cron_every_quarter_hour_through_the_repeated_hour_runs_each_wall_time_once() -> None:
    schedule = parse_schedule("s", {"topic": "t", "cron": "*/15 * * * *",
                                    "timezone": "Europe/Paris"})
    start = ms(2026, 10, 25, 1, 50, tz=PARIS)
    now = start + 3 * 3600 * 1000
    walls = [local(t)[11:16] for t in schedule.due_ticks(start, now)]
    assert len(walls) == len(set(walls)), walls
    assert walls[:6] == ["02:00", "02:15", "02:30", "02:45", "03:00", "03:15"]


def test_cron_due_ticks_after_a_downtime_on_a_fixed_clock() -> None:
    schedule = parse_schedule("s", {"topic": "t", "cron": "0 * * * *"})
    due = schedule.due_ticks(ms(2026, 1, 1, 0, 30), ms(2026, 1, 1, 5, 10))
    assert due == [ms(2026, 1, 1, h) for h in range(1, 6)]


# -- parsing and check ids -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "entry", "check_id"), [
    ("", {"topic": "t", "every": 1}, "sqlqueue.E301"),
    ("s", ["topic", "t"], "sqlqueue.E301"),
    ("s", {"topic": "t", "every": 1, "evry": 2}, "sqlqueue.E302"),
    ("s", {"topic": "t"}, "sqlqueue.E303"),
    ("s", {"topic": "t", "every": 60, "cron": "* * * * *"}, "sqlqueue.E303"),
    ("s", {"topic": "t", "every": 60, "timezone": "UTC"}, "sqlqueue.E303"),
    ("s", {"topic": "t", "every": 0}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": -5}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": "fast"}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": float("nan")}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": True}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": 60, "jitter": -1}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": 60, "catch_up": 0}, "sqlqueue.E304"),
    ("s", {"topic": "t", "every": 60, "catch_up": MAX_CATCH_UP + 1}, "sqlqueue.E304"),
    ("s", {"topic": "t", "cron": "61 * * * *"}, "sqlqueue.E305"),
    ("s", {"topic": "t", "cron": "* * * *"}, "sqlqueue.E305"),
    ("s", {"topic": "t", "cron": "0 0 * * * *"}, "sqlqueue.E305"),
    ("s", {"topic": "t", "cron": 5}, "sqlqueue.E305"),
    ("s", {"topic": "t", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "sqlqueue.E306"),
    ("s", {"topic": "t", "cron": "0 3 * * *", "timezone": 1}, "sqlqueue.E306"),
    ("s", {"every": 60}, "sqlqueue.E307"),
    ("s", {"topic": "t", "task": "a.b", "every": 60}, "sqlqueue.E307"),
    ("s", {"topic": "t", "args": [1], "every": 60}, "sqlqueue.E307"),
    ("s", {"task": "a.b", "payload": 1, "every": 60}, "sqlqueue.E307"),
    ("s", {"task": "nodots", "every": 60}, "sqlqueue.E308"),
    ("s", {"task": "a.b", "args": "x", "every": 60}, "sqlqueue.E309"),
    ("s", {"task": "a.b", "args": [object()], "every": 60}, "sqlqueue.E309"),
    ("s", {"topic": "t", "metadata": {"tick": "x"}, "every": 60}, "sqlqueue.E309"),
    ("s", {"topic": "t", "metadata": {"k": 1}, "every": 60}, "sqlqueue.E309"),
])
def test_each_bad_entry_has_its_check_id(name: str, entry: Any, check_id: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        parse_schedule(name, entry)
    assert raised.value.check_id == check_id, str(raised.value)


def test_every_problem_is_reported_and_the_good_entries_kept() -> None:
    schedules, errors = parse_schedules({
        "good": {"topic": "t", "every": 60},
        "bad": {"topic": "t", "every": 0},
        "worse": {"topic": "t", "cron": "nope"},
    })
    assert [s.name for s in schedules] == ["good"]
    assert sorted(e.check_id for e in errors) == ["sqlqueue.E304", "sqlqueue.E305"]
    assert parse_schedules(["x"])[1][0].check_id == "sqlqueue.E301"


def test_a_task_schedule_keeps_its_arguments() -> None:
    schedule = parse_schedule("report", {"task": "shop.tasks.report", "args": [1],
                                         "kwargs": {"full": True}, "cron": "0 6 * * 1"})
    assert isinstance(schedule, Schedule)
    assert (schedule.task, schedule.args, dict(schedule.kwargs)) == (
        "shop.tasks.report", (1,), {"full": True})
    assert schedule.definition == "cron 0 6 * * 1 UTC"
