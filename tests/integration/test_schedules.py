"""Schedules against a real database, on an injected clock: each tick published once
whichever process claims it, catch-up after downtime, task schedules, check ids."""

from __future__ import annotations

import io
import logging
import threading
from typing import Any

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client, override_settings
from django.urls import reverse

from sqlqueue.models import QueueMessage, ScheduleState
from sqlqueue.scheduling import configured_schedules
from sqlqueue.scheduling.definitions import parse_schedule
from sqlqueue.scheduling.ticker import Ticker
from tests.conftest import stored_messages
from tests.integration.consuming_helpers import drain, register
from tests.integration.test_admin import admin_client, staff_with

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]

MINUTE = 60_000
T0 = 1_795_000_000_000 // MINUTE * MINUTE  # a whole minute in 2026


class Clock:
    """The database clock of a test: moved by hand."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def ticks_of(name: str) -> list[dict[str, Any]]:
    return [{**m, "tick": m["metadata"]["tick"]} for m in stored_messages()
            if (m["metadata"] or {}).get("schedule") == name]


def test_a_schedule_starts_now_and_publishes_each_tick_once() -> None:
    schedule = parse_schedule("beat", {"topic": "beats", "payload": {"n": 1}, "every": 60})
    clock = Clock(T0 + 30_000)
    ticker = Ticker([schedule], clock)
    assert ticker.run_due() == []  # first look: a row starting now, nothing from before
    assert ticks_of("beat") == []
    assert ticker.next_due_ms() == T0 + MINUTE
    clock.now = T0 + MINUTE
    (published,) = ticker.run_due()
    assert published.ticks == [T0 + MINUTE]
    assert ticker.run_due() == []  # the same tick again: nothing
    (message,) = ticks_of("beat")
    assert message["payload"] == {"n": 1}
    assert message["id"].startswith("schedule:beat:")
    state = ScheduleState.objects.get(name="beat")
    assert (state.checked_until, state.last_tick, state.last_offset, state.last_topic) == (
        T0 + MINUTE, T0 + MINUTE, message["offset"], "beats")
    assert state.definition == "every 60s"


def test_two_processes_one_tick_the_second_finds_it_claimed() -> None:
    schedule = parse_schedule("beat", {"topic": "beats", "every": 60})
    clock = Clock(T0 + 1)
    first, second = Ticker([schedule], clock), Ticker([schedule], clock)
    first.run_due()
    second.run_due()  # both have read checked_until = T0 + 1
    clock.now = T0 + MINUTE
    assert len(first.run_due()) == 1
    assert second.run_due() == []  # its compare-and-set found the first's value
    clock.now = T0 + 2 * MINUTE
    assert len(second.run_due()) == 1  # and it goes on from there
    assert first.run_due() == []
    assert [m["tick"] for m in ticks_of("beat")] == [
        schedule.tick_label(T0 + MINUTE), schedule.tick_label(T0 + 2 * MINUTE)]


def test_concurrent_tickers_on_their_own_connections_publish_each_tick_once() -> None:
    schedule = parse_schedule("beat", {"topic": "beats", "every": 60})
    clock = Clock(T0 + 1)
    Ticker([schedule], clock).run_due()  # the row exists
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def process() -> None:
        try:
            ticker = Ticker([schedule], clock)
            barrier.wait()
            for _ in range(5):
                ticker.run_due()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    clock.now = T0 + 3 * MINUTE
    threads = [threading.Thread(target=process) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    # catch_up = 1: the three missed ticks give one message, the newest, once.
    assert [m["tick"] for m in ticks_of("beat")] == [schedule.tick_label(T0 + 3 * MINUTE)]


def test_catch_up_publishes_the_newest_missed_ticks_and_skips_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schedule = parse_schedule("hourly", {"topic": "reports", "cron": "0 * * * *",
                                         "catch_up": 3})
    hour = 60 * MINUTE
    start = T0 // hour * hour
    clock = Clock(start + 1)
    Ticker([schedule], clock).run_due()
    clock.now = start + 10 * hour + 5 * MINUTE  # ten hours down
    with caplog.at_level(logging.WARNING, logger="sqlqueue.schedules"):
        (published,) = Ticker([schedule], clock).run_due()
    assert published.ticks == [start + 8 * hour, start + 9 * hour, start + 10 * hour]
    assert published.skipped == 7
    assert "7 missed tick(s) skipped" in caplog.text
    assert len(ticks_of("hourly")) == 3


def test_a_changed_definition_applies_from_the_last_checked_time() -> None:
    clock = Clock(T0 + 1)
    Ticker([parse_schedule("s", {"topic": "t", "every": 3600})], clock).run_due()
    faster = parse_schedule("s", {"topic": "t", "every": 60})
    clock.now = T0 + MINUTE
    (published,) = Ticker([faster], clock).run_due()
    assert published.ticks == [T0 + MINUTE]
    assert ScheduleState.objects.get(name="s").definition == "every 60s"


def test_a_failing_publish_rolls_the_claim_back(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = parse_schedule("beat", {"topic": "beats", "every": 60})
    clock = Clock(T0 + 1)
    ticker = Ticker([schedule], clock)
    ticker.run_due()
    clock.now = T0 + MINUTE

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the broker of the broker is down")

    monkeypatch.setattr("sqlqueue.scheduling.ticker.send_message", broken)
    assert ticker.run_due() == []
    assert ScheduleState.objects.get(name="beat").checked_until == T0 + 1  # not claimed
    monkeypatch.undo()
    fresh = Ticker([schedule], clock)  # another process, or this one a minute later
    assert [p.ticks for p in fresh.run_due()] == [[T0 + MINUTE]]


def test_message_options_reach_the_message() -> None:
    schedule = parse_schedule("s", {"topic": "t", "payload": [1, 2], "every": 60,
                                    "partition_key": "k", "priority": 7,
                                    "metadata": {"source": "cron"}})
    clock = Clock(T0 + 1)
    ticker = Ticker([schedule], clock)
    ticker.run_due()
    clock.now = T0 + MINUTE
    ticker.run_due()
    message = QueueMessage.objects.get(topic="t")
    assert (message.partition_key, message.priority) == ("k", 7)
    assert message.metadata == {"source": "cron", "schedule": "s",
                                            "tick": schedule.tick_label(T0 + MINUTE)}


def test_a_scheduled_task_runs_and_its_result_is_recorded() -> None:
    pytest.importorskip("sqlqueue.integrations.tasks.compat")
    from sqlqueue.integrations.tasks.models import Status, TaskRecord

    schedule = parse_schedule("adder", {"task": "tests.testapp.tasks.add", "args": [2, 3],
                                        "every": 60})
    clock = Clock(T0 + 1)
    ticker = Ticker([schedule], clock)
    ticker.run_due()
    clock.now = T0 + MINUTE
    ticker.run_due()
    (record,) = TaskRecord.objects.all()
    message = QueueMessage.objects.get(offset=record.message_offset)
    assert message.metadata["schedule"] == "adder"
    state = ScheduleState.objects.get(name="adder")
    assert (state.last_offset, state.last_message_id) == (record.message_offset, record.id)
    drain(["tasks"])
    record.refresh_from_db()
    assert record.status == Status.SUCCESSFUL
    assert record.return_value == 5


# -- checks --------------------------------------------------------------------------------

def schedule_check_ids(schedules: dict[str, Any]) -> list[str]:
    with override_settings(SQLQUEUE={"SCHEDULES": schedules}):
        return sorted(m.id for m in checks.run_checks(tags=["sqlqueue"]) if (m.id or "").startswith(
            "sqlqueue.E3"))


@pytest.mark.parametrize(("entry", "check_id"), [
    ({"topic": "bad\ntopic", "every": 60}, "sqlqueue.E307"),
    ({"topic": "t", "payload": {1, 2}, "every": 60}, "sqlqueue.E309"),
    ({"topic": "t", "partition_key": "x" * 300, "every": 60}, "sqlqueue.E309"),
    ({"topic": "t", "priority": 1000, "every": 60}, "sqlqueue.E309"),
    ({"task": "tests.testapp.tasks.no_such_task", "every": 60}, "sqlqueue.E308"),
    ({"task": "tests.testapp.models.Order", "every": 60}, "sqlqueue.E308"),
    ({"topic": "t", "every": 0}, "sqlqueue.E304"),
    ({"topic": "t", "cron": "every day"}, "sqlqueue.E305"),
])
def test_manage_py_check_names_each_bad_schedule(entry: dict[str, Any], check_id: str) -> None:
    assert schedule_check_ids({"s": entry, "fine": {"topic": "t", "every": 60}}) == [check_id]


def test_manage_py_check_refuses_schedules_that_are_not_a_dict() -> None:
    with override_settings(SQLQUEUE={"SCHEDULES": ["beat"]}):
        ids = [m.id for m in checks.run_checks(tags=["sqlqueue"])]
    assert "sqlqueue.E301" in ids


def test_good_schedules_pass_the_checks_and_load() -> None:
    good = {"beat": {"topic": "t", "every": 60},
            "paris": {"topic": "t", "cron": "0 3 * * *", "timezone": "Europe/Paris"},
            "adder": {"task": "tests.testapp.tasks.add", "args": [1, 2], "every": 3600}}
    try:
        import sqlqueue.integrations.tasks.compat  # noqa: F401
    except ImportError:
        del good["adder"]
    assert schedule_check_ids(good) == []
    with override_settings(SQLQUEUE={"SCHEDULES": good}):
        assert [s.name for s in configured_schedules()] == list(good)


# -- operators: queue schedules, the admin page, metrics -------------------------------------

BEAT = {"beat": {"topic": "beats", "payload": {"n": 1}, "every": 60}}


def published_beat(clock: Clock) -> None:
    with override_settings(SQLQUEUE={"SCHEDULES": BEAT}):
        ticker = Ticker(configured_schedules(), clock)
        ticker.run_due()
        clock.now = T0 + MINUTE
        assert ticker.run_due()


def test_queue_schedules_lists_each_with_its_next_and_last_tick_and_outcomes(
    register: Any,
) -> None:
    register("beats", "listeners", lambda message: None)
    published_beat(Clock(T0 + 1))
    with override_settings(SQLQUEUE={"SCHEDULES": {
            **BEAT, "later": {"topic": "t", "cron": "0 3 * * *"}}}):
        out = io.StringIO()
        call_command("queue", "schedules", stdout=out)
        listing = out.getvalue()
        assert "beat: every 60s -> topic beats; next " in listing
        assert "last tick 2026" in listing and "listeners: waiting" in listing
        assert "later: cron 0 3 * * * UTC -> topic t; next " in listing
        assert "no tick published yet" in listing
        drain(["listeners"])
        out = io.StringIO()
        call_command("queue", "schedules", "list", stdout=out)
        assert "listeners: done" in out.getvalue()


def test_a_removed_schedule_is_listed_as_removed_and_publishes_nothing() -> None:
    published_beat(Clock(T0 + 1))
    with override_settings(SQLQUEUE={"SCHEDULES": {}}):
        out = io.StringIO()
        call_command("queue", "schedules", stdout=out)
    assert "beat: every 60s -> (removed from settings); publishes nothing" in out.getvalue()
    with override_settings(SQLQUEUE={"SCHEDULES": BEAT}), pytest.raises(
            CommandError, match="still in SQLQUEUE"):
        call_command("queue", "schedules", "forget", "beat")
    with override_settings(SQLQUEUE={"SCHEDULES": {}}):
        call_command("queue", "schedules", "forget", "beat", stdout=io.StringIO())
        assert not ScheduleState.objects.exists()
        with pytest.raises(CommandError, match="No schedule 'beat' is stored"):
            call_command("queue", "schedules", "forget", "beat")


def test_queue_schedules_run_publishes_one_tick_now() -> None:
    with override_settings(SQLQUEUE={"SCHEDULES": BEAT}):
        out = io.StringIO()
        call_command("queue", "schedules", "run", "beat", stdout=out)
        assert "Published a tick of beat: message schedule:beat:" in out.getvalue()
        (message,) = ticks_of("beat")
        assert message["payload"] == {"n": 1}
        assert ScheduleState.objects.get(name="beat").last_offset == message["offset"]
        with pytest.raises(CommandError, match="No schedule named 'nope'"):
            call_command("queue", "schedules", "run", "nope")


def test_the_admin_page_shows_schedules_and_runs_one_for_permitted_users(
    admin_client: Client,
) -> None:
    published_beat(Clock(T0 + 1))
    page = reverse("admin:sqlqueue_schedulestate_changelist")
    run = reverse("admin:sqlqueue_schedulestate_run")
    with override_settings(SQLQUEUE={"SCHEDULES": BEAT}):
        response = admin_client.get(page)
        assert response.status_code == 200
        text = response.content.decode()
        assert "every 60s" in text and "schedule:beat:" in text and "Run now" in text
        assert admin_client.post(run, {"name": "beat"}).status_code == 302
        assert len(ticks_of("beat")) == 2
        viewer = staff_with("view_schedulestate")
        assert viewer.get(page).status_code == 200
        assert "Run now" not in viewer.get(page).content.decode()
        assert viewer.post(run, {"name": "beat"}).status_code == 403
        assert len(ticks_of("beat")) == 2


def test_metrics_report_the_age_of_each_schedules_last_tick(admin_client: Client) -> None:
    published_beat(Clock(T0 + 1))
    with override_settings(SQLQUEUE={"SCHEDULES": BEAT}):
        text = admin_client.get(reverse("sqlqueue:metrics")).content.decode()
    assert 'sqlqueue_schedule_last_tick_age_seconds{schedule="beat"}' in text
    assert 'sqlqueue_schedule_next_tick_seconds{schedule="beat"}' in text
