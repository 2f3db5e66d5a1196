"""Issue 42: schedules kept in the database besides SQLQUEUE["SCHEDULES"], created,
edited, paused, resumed and run from the admin, checked as the setting's are, and ticked
by every runner (ReloadingTicker), each tick once."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from sqlqueue.admin.stored_schedules import StoredScheduleForm
from sqlqueue.models import ScheduleState, StoredSchedule
from sqlqueue.operations.schedules import run_schedule_now, schedule_overview
from sqlqueue.operations.stored_schedules import save_stored_schedule, set_paused
from sqlqueue.scheduling import ScheduleError
from sqlqueue.scheduling.definitions import Schedule
from sqlqueue.scheduling.stored import ReloadingTicker
from tests.integration.test_admin import admin_client, staff_with
from tests.integration.test_schedules import MINUTE, T0, Clock, ticks_of

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client"]
RELOAD = 5_000


@pytest.mark.parametrize(("entry", "check_id", "words"), [
    ({"topic": "t", "cron": "61 * * * *"}, "sqlqueue.E305", "This schedule['cron']"),
    ({"topic": "t", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "sqlqueue.E306",
     "is not a known time zone"),
    ({"topic": "t", "every": 60, "payload": {1, 2}}, "sqlqueue.E309", "cannot be published"),
    ({"task": "tests.testapp.tasks.no_such_task", "every": 60}, "sqlqueue.E308",
     "is not a registered @task"),
    ({"topic": "t"}, "sqlqueue.E303", "exactly one of 'every'"),
])
def test_a_stored_schedule_is_checked_as_a_setting_is(entry: dict[str, Any], check_id: str,
                                                      words: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        save_stored_schedule("bad", entry)
    assert caught.value.check_id == check_id and words in str(caught.value)
    assert not StoredSchedule.objects.exists()


def test_a_name_of_the_setting_is_refused() -> None:
    taken = {"beat": {"topic": "t", "every": 60}}
    with (override_settings(SQLQUEUE={"SCHEDULES": taken}),
          pytest.raises(ScheduleError, match=r"in SQLQUEUE\['SCHEDULES'\] already")):
        save_stored_schedule("beat", {"topic": "t", "every": 30})


def test_runners_tick_a_stored_schedule_once_and_follow_its_edits() -> None:
    clock = Clock(T0 + 1)
    first, second = ReloadingTicker([], clock), ReloadingTicker([], clock)
    assert first.run_due() == [] and first.next_due_ms() == T0 + 1 + RELOAD
    save_stored_schedule("beat", {"topic": "beats", "payload": {"n": 1}, "every": 60},
                         by="alice")
    clock.now = T0 + 1 + RELOAD  # both reload: the new schedule starts from now
    first.run_due()
    second.run_due()
    for minute in (1, 2, 3):
        clock.now = T0 + minute * MINUTE
        published = first.run_due() + second.run_due()
        assert [p.ticks for p in published] == [[T0 + minute * MINUTE]]
    # Edited: every 30 s from the last tick on.
    save_stored_schedule("beat", {"topic": "beats", "payload": {"n": 2}, "every": 30})
    clock.now = T0 + 3 * MINUTE + 30_000
    assert [p.ticks for p in first.run_due() + second.run_due()] == [
        [T0 + 3 * MINUTE + 30_000]]
    assert ticks_of("beat")[-1]["payload"] == {"n": 2}
    # Paused: nothing; resumed: from then on, the missed ticks not published.
    assert set_paused(["beat"], True, by="bob") == 1
    clock.now = T0 + 10 * MINUTE
    assert first.run_due() + second.run_due() == []
    set_paused(["beat"], False)
    assert ScheduleState.objects.get(name="beat").checked_until > T0 + 10 * MINUTE
    clock.now = T0 + 10 * MINUTE + RELOAD
    assert first.run_due() + second.run_due() == []  # the missed ticks: skipped
    # Deleted: nothing more.
    StoredSchedule.objects.all().delete()
    clock.now += RELOAD + MINUTE
    assert first.run_due() + second.run_due() == []
    ticks = [m["tick"] for m in ticks_of("beat")]
    assert len(ticks) == len(set(ticks)) == 4


def test_run_now_and_the_overview_cover_stored_schedules() -> None:
    save_stored_schedule("stored", {"topic": "beats", "every": 60})
    save_stored_schedule("sleeping", {"topic": "beats", "cron": "0 3 * * *",
                                      "timezone": "Europe/Paris"}, paused=True)
    with override_settings(SQLQUEUE={"SCHEDULES": {"beat": {"topic": "t", "every": 60}}}):
        tick = run_schedule_now("stored")
        assert tick.topic == "beats"
        views = {v.name: v for v in schedule_overview(T0)}
    assert (views["beat"].source, views["stored"].source) == ("settings", "database")
    assert views["sleeping"].paused and views["sleeping"].target == "(paused)"
    assert views["stored"].row is not None and views["stored"].row.last_offset == tick.offset


def form(**values: Any) -> dict[str, Any]:
    return {"name": "", "every": "", "cron": "", "timezone": "", "topic": "", "payload": "",
            "partition_key": "", "priority": "", "task": "", "args": "", "kwargs": "",
            "jitter": "", "catch_up": "", **values}


def test_the_admin_creates_checks_edits_pauses_and_runs(admin_client: Client) -> None:
    add = reverse("admin:sqlqueue_storedschedule_add")
    bad = admin_client.post(add, form(name="nightly", cron="0 25 * * *", topic="reports"))
    assert bad.status_code == 200 and "is not a 5-field cron expression" in bad.text
    assert not StoredSchedule.objects.exists()
    done = admin_client.post(add, form(name="nightly", cron="0 3 * * *",
                                       timezone="Europe/Paris", topic="reports",
                                       payload='{"kind": "daily"}'))
    assert done.status_code == 302, done.text
    stored = StoredSchedule.objects.get()
    assert stored.entry == {"cron": "0 3 * * *", "timezone": "Europe/Paris",
                            "topic": "reports", "payload": {"kind": "daily"}}
    assert stored.changed_by == "boss"
    change = reverse("admin:sqlqueue_storedschedule_change", args=["nightly"])
    page = admin_client.get(change)
    assert 'value="0 3 * * *"' in page.text and "Europe/Paris" in page.text
    admin_client.post(change, form(name="nightly", every="3600", topic="reports"))
    assert StoredSchedule.objects.get().entry == {"every": 3600, "topic": "reports"}

    changelist = reverse("admin:sqlqueue_storedschedule_changelist")
    paused = admin_client.post(changelist, {"action": "pause", "_selected_action": ["nightly"]},
                               follow=True)
    assert "Paused 1 schedule(s)." in paused.text and StoredSchedule.objects.get().paused
    ran = admin_client.post(changelist, {"action": "run_now", "_selected_action": ["nightly"]},
                            follow=True)
    assert "Published a tick of nightly" in ran.text
    with override_settings(SQLQUEUE={"SCHEDULES": {"beat": {"topic": "t", "every": 60}}}):
        overview = admin_client.get(reverse("admin:sqlqueue_schedulestate_changelist")).text
    assert "settings (read-only)" in overview and "database, <strong>paused</strong>" in overview
    assert f'href="{change}"' in overview and 'id="sqlqueue-add-schedule"' in overview


def test_the_admin_needs_the_model_permissions() -> None:
    save_stored_schedule("nightly", {"topic": "reports", "every": 3600})
    viewer = staff_with("view_storedschedule", "view_schedulestate")
    changelist = reverse("admin:sqlqueue_storedschedule_changelist")
    assert viewer.get(changelist).status_code == 200
    assert viewer.get(reverse("admin:sqlqueue_storedschedule_add")).status_code == 403
    viewer.post(changelist, {"action": "pause", "_selected_action": ["nightly"]})
    assert not StoredSchedule.objects.get().paused
    overview = viewer.get(reverse("admin:sqlqueue_schedulestate_changelist")).text
    assert "sqlqueue-add-schedule" not in overview


def test_the_jitter_help_text_says_what_the_runner_does() -> None:
    """Issue 53, F11: the form said "random delay"; the delay is derived from the schedule
    and the tick, the same in every process (as docs/guides/schedules.md says)."""
    help_text = str(StoredScheduleForm.base_fields["jitter"].help_text)
    assert "random" not in help_text.lower()
    assert "derived from the schedule and the tick" in help_text
    assert "the same in every process" in help_text
    # ... which is what the runner does: two processes' copies agree on every tick's delay,
    # a delay up to the jitter that differs from tick to tick
    here, there = (Schedule(name="beat", topic="t", every_ms=MINUTE, jitter_ms=30_000)
                   for _ in range(2))
    delays = [here.jitter_for(T0 + n * MINUTE) for n in range(20)]
    assert delays == [there.jitter_for(T0 + n * MINUTE) for n in range(20)]
    assert all(0 <= delay <= 30_000 for delay in delays) and len(set(delays)) > 1


@pytest.mark.parametrize("delete", ["orm_row", "orm_queryset", "admin_action"])
def test_a_stored_schedule_created_again_starts_afresh(
        delete: str, admin_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 53, F14: deleted, its ``queue_schedules`` row went on living, and the same
    name created again later went on from it ("1 missed tick(s) skipped"), whereas a
    schedule seen for the first time starts from that moment."""
    clock = Clock(T0 + 1)
    runner = ReloadingTicker([], clock, reload_ms=RELOAD)
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    runner.run_due()  # seen: its row starts now
    clock.now = T0 + MINUTE
    assert [p.ticks for p in runner.run_due()] == [[T0 + MINUTE]]
    assert ScheduleState.objects.filter(name="beat").exists()
    if delete == "orm_row":
        StoredSchedule.objects.get(name="beat").delete()
    elif delete == "orm_queryset":
        StoredSchedule.objects.filter(name="beat").delete()
    else:
        changelist = reverse("admin:sqlqueue_storedschedule_changelist")
        done = admin_client.post(changelist, {"action": "delete_selected", "post": "yes",
                                              "_selected_action": ["beat"]})
        assert done.status_code == 302 and not StoredSchedule.objects.exists()
    assert not ScheduleState.objects.filter(name="beat").exists()
    clock.now = T0 + 5 * MINUTE + 1  # the runner reloads: nothing of "beat" any more
    assert runner.run_due() == []
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    clock.now += RELOAD
    caplog.set_level(logging.INFO, logger="sqlqueue.schedules")
    assert runner.run_due() == []  # starts from now: 2 to 5 minutes were never its ticks
    clock.now = T0 + 6 * MINUTE
    assert [(p.ticks, p.skipped) for p in runner.run_due()] == [([T0 + 6 * MINUTE], 0)]
    assert "missed tick" not in caplog.text
    assert [m["tick"] for m in ticks_of("beat")] == [
        Schedule(name="beat", every_ms=MINUTE).tick_label(tick)
        for tick in (T0 + MINUTE, T0 + 6 * MINUTE)]


def test_a_runner_that_wrote_the_row_back_does_not_leak_it_into_the_new_schedule() -> None:
    """Deleted while a runner has it loaded (up to one reload): the runner may write the
    row back at its next tick; creating the schedule again clears it once more."""
    clock = Clock(T0 + 1)
    runner = ReloadingTicker([], clock, reload_ms=10 * MINUTE)
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    runner.run_due()
    StoredSchedule.objects.filter(name="beat").delete()
    clock.now = T0 + MINUTE  # not reloaded yet: its claim finds no row, it writes one back
    assert runner.run_due() == []
    assert ScheduleState.objects.filter(name="beat").exists()
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    assert not ScheduleState.objects.filter(name="beat").exists()
