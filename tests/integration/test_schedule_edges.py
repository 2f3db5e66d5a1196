"""Issue 53 (SPEC §11, "The tester's and the operator's edges"; wave-4 security audit W1,
W2, W4): a stored schedule's task is chosen among the registered ``@task``s and never
imported from a typed path; its topic is never a Tasks backend's and must match
``SQLQUEUE["SCHEDULE_TOPICS"]``; absurd values are form errors beside their field, never an
HTTP 500. The runners check each stored row again: one written by hand publishes nothing
and imports nothing."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.test import override_settings
from django.urls import reverse

from sqlqueue.conf import validate
from sqlqueue.models import QueueMessage, StoredSchedule
from sqlqueue.operations.schedules import UnknownSchedule, run_schedule_now, schedule_overview
from sqlqueue.operations.stored_schedules import save_stored_schedule
from sqlqueue.scheduling import ScheduleError
from sqlqueue.scheduling.definitions import parse_schedule
from sqlqueue.scheduling.stored import ReloadingTicker
from sqlqueue.scheduling.targets import target_for
from tests.integration.test_admin import admin_client, staff_with
from tests.integration.test_schedules import T0, Clock

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client"]
RELOAD = 5_000
ADD = "admin:sqlqueue_storedschedule_add"
#: modules with an import-time effect: one outside every app, one inside an installed app
CANARIES = ("tests.import_canary", "tests.testapp.import_canary")
#: what a user with only the schedule permissions holds (the audit's "sched" user)
SCHEDULER = ("view_storedschedule", "add_storedschedule", "change_storedschedule",
             "view_schedulestate")


def form(**values: Any) -> dict[str, Any]:
    return {"name": "", "every": "", "cron": "", "timezone": "", "topic": "", "payload": "",
            "partition_key": "", "priority": "", "task": "", "args": "", "kwargs": "",
            "jitter": "", "catch_up": "", **values}


def form_errors(response: Any) -> dict[str, list[str]]:
    """The add or change form's errors by field ("__all__": the form's own)."""
    assert response.status_code == 200, response.status_code
    return {key: list(errors) for key, errors in
            response.context["adminform"].form.errors.items()}


def assert_not_imported() -> None:
    for module in CANARIES:
        assert module not in sys.modules, f"{module} was imported"


@pytest.fixture
def tasks() -> None:
    pytest.importorskip("sqlqueue.integrations.tasks.compat")


# -- W1: the task is chosen, never imported from a typed path ---------------------------------

@pytest.mark.parametrize("module", CANARIES)
def test_a_typed_task_path_is_refused_without_importing_it(module: str) -> None:
    assert_not_imported()
    with pytest.raises(ScheduleError) as caught:
        save_stored_schedule("canary", {"task": f"{module}.run", "every": 60})
    assert caught.value.check_id == "sqlqueue.E308" and caught.value.key == "task"
    assert "not a registered @task" in str(caught.value)
    assert "nothing was imported" in str(caught.value)
    assert_not_imported()
    assert not StoredSchedule.objects.exists()


@pytest.mark.parametrize("module", CANARIES)
def test_the_admin_form_imports_nothing_a_user_types(module: str) -> None:
    assert_not_imported()
    client = staff_with(*SCHEDULER)
    response = client.post(reverse(ADD), form(name="canary", every="60", task=f"{module}.run"))
    errors = form_errors(response)
    assert list(errors) == ["task"] and "Select a valid choice" in errors["task"][0]
    assert_not_imported()
    assert not StoredSchedule.objects.exists()


def test_the_form_offers_the_registered_tasks(tasks: None) -> None:
    from sqlqueue.operations.stored_schedules import schedulable_tasks

    client = staff_with(*SCHEDULER)
    page = client.get(reverse(ADD)).text
    assert '<select name="task"' in page
    assert '<option value="tests.testapp.tasks.add">' in page
    assert "tests.testapp.tasks.send_email" in schedulable_tasks()
    assert not any(path.startswith("tests.import_canary") for path in schedulable_tasks())
    saved = client.post(reverse(ADD), form(name="adder", every="60",
                                            task="tests.testapp.tasks.add", args="[1, 2]"))
    assert saved.status_code == 302, form_errors(saved)
    assert StoredSchedule.objects.get().entry == {"every": 60, "task": "tests.testapp.tasks.add",
                                                  "args": [1, 2]}


def test_a_row_written_by_hand_is_shown_refused_and_never_run(tasks: None) -> None:
    """A row that did not come through the form (a fixture, a script, an older version):
    its change page shows the path without importing it, saving it is refused, and the
    runners and "Run now" publish nothing for it."""
    assert_not_imported()
    StoredSchedule.objects.create(name="canary", entry={"task": "tests.import_canary.run",
                                                        "every": 1})
    client = staff_with(*SCHEDULER)
    change = reverse("admin:sqlqueue_storedschedule_change", args=["canary"])
    page = client.get(change).text
    assert "tests.import_canary.run (not a registered task)" in page
    errors = form_errors(client.post(change, form(name="canary", every="1",
                                                  task="tests.import_canary.run")))
    assert "not a registered @task" in errors["task"][0]
    clock = Clock(T0 + 1)
    ticker = ReloadingTicker([], clock, reload_ms=RELOAD)
    for step in range(3):
        clock.now = T0 + 1 + step * RELOAD
        assert ticker.run_due() == []
    with pytest.raises(UnknownSchedule, match="not a registered @task"):
        run_schedule_now("canary")
    assert not QueueMessage.objects.exists()
    assert_not_imported()


def test_the_runners_enqueue_only_a_registered_task(tasks: None) -> None:
    schedule = parse_schedule("canary", {"task": "tests.import_canary.run", "every": 60})
    with pytest.raises(ScheduleError, match="not a registered @task"):
        target_for(schedule).enqueue(schedule, T0, {})
    assert not QueueMessage.objects.exists()
    assert_not_imported()


# -- W2: who may edit schedules may publish, within SCHEDULE_TOPICS, never as a task ----------

FORGED = '{"task": "tests.testapp.tasks.create_order", "args": ["forged"], "kwargs": {}}'


@pytest.mark.parametrize("topic", ["tasks.default", "tasks.emails", "tasks.anything",
                                   "tasks.default_dlq", "strict.default"])
def test_a_tasks_backends_topic_is_refused(tasks: None, topic: str) -> None:
    client = staff_with(*SCHEDULER)
    errors = form_errors(client.post(reverse(ADD), form(name="forged", every="1", topic=topic,
                                                        payload=FORGED)))
    assert list(errors) == ["topic"] and "is a topic of a Tasks backend" in errors["topic"][0]
    assert not StoredSchedule.objects.exists()
    # Even when SCHEDULE_TOPICS names it.
    with (override_settings(SQLQUEUE={"SCHEDULE_TOPICS": ["*", topic]}),
          pytest.raises(ScheduleError, match="is a topic of a Tasks backend")):
        save_stored_schedule("forged", {"topic": topic, "payload": {}, "every": 1})


def test_an_empty_topic_prefix_reserves_the_queues_topics(tasks: None) -> None:
    backend = {"BACKEND": "sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["mail"],
               "OPTIONS": {"TOPIC_PREFIX": "", "GROUP": "bare-tasks"}}
    with override_settings(TASKS={"default": backend}):
        with pytest.raises(ScheduleError, match="is a topic of a Tasks backend"):
            save_stored_schedule("forged", {"topic": "mail", "payload": {}, "every": 1})
        save_stored_schedule("fine", {"topic": "mailbox", "payload": {}, "every": 1})


def test_schedule_topics_limits_what_a_stored_schedule_publishes_to() -> None:
    with override_settings(SQLQUEUE={"SCHEDULE_TOPICS": ["reports.*", "maintenance"]}):
        save_stored_schedule("daily", {"topic": "reports.daily", "every": 60})
        save_stored_schedule("clean", {"topic": "maintenance", "every": 60})
        with pytest.raises(ScheduleError) as caught:
            save_stored_schedule("orders", {"topic": "orders", "every": 60})
        assert caught.value.key == "topic"
        assert "SQLQUEUE['SCHEDULE_TOPICS'] allows reports.*, maintenance" in str(caught.value)
        errors = form_errors(staff_with(*SCHEDULER).post(
            reverse(ADD), form(name="orders", every="60", topic="orders")))
        assert list(errors) == ["topic"] and "SCHEDULE_TOPICS" in errors["topic"][0]
    # The setting's own schedules are the project's code: not limited by it.
    settings_schedule = {"beat": {"topic": "orders", "every": 60}}
    with override_settings(SQLQUEUE={"SCHEDULE_TOPICS": [], "SCHEDULES": settings_schedule}):
        assert run_schedule_now("beat").topic == "orders"


def test_the_runners_skip_rows_whose_topic_is_not_allowed(tasks: None) -> None:
    """Rows written by hand, or allowed when saved and not since: the runners leave them
    out, and "Run now" refuses them."""
    StoredSchedule.objects.create(name="forged", entry={
        "topic": "tasks.default", "every": 1,
        "payload": {"task": "tests.testapp.tasks.create_order", "args": ["x"], "kwargs": {}}})
    save_stored_schedule("orders", {"topic": "orders", "every": 1})
    clock = Clock(T0 + 1)
    with override_settings(SQLQUEUE={"SCHEDULE_TOPICS": ["reports.*"]}):
        ticker = ReloadingTicker([], clock, reload_ms=RELOAD)
        for step in range(3):
            clock.now = T0 + 1 + step * RELOAD
            assert ticker.run_due() == []
        for name in ("forged", "orders"):
            with pytest.raises(UnknownSchedule, match="not usable"):
                run_schedule_now(name)
    assert not QueueMessage.objects.exists()


@pytest.mark.parametrize(("value", "check_id", "words"), [
    ("reports.*", "sqlqueue.E003", "must be a list of topic patterns"),
    ({"reports.*": True}, "sqlqueue.E003", "must be a list of topic patterns"),
    (["reports.*", ""], "sqlqueue.E004", "non-empty strings"),
    ([3], "sqlqueue.E004", "non-empty strings"),
])
def test_schedule_topics_is_checked(value: Any, check_id: str, words: str) -> None:
    settings, problems = validate({"SCHEDULE_TOPICS": value})
    assert settings is None
    assert [(p.id, words in p.msg) for p in problems] == [(check_id, True)]


def test_schedule_topics_allows_every_topic_by_default() -> None:
    settings, _ = validate({})
    assert settings is not None and settings.SCHEDULE_TOPICS == ("*",)
    assert settings.allows_schedule_topic("anything.at.all")
    narrowed, _ = validate({"SCHEDULE_TOPICS": ["Reports.?"]})
    assert narrowed is not None and narrowed.allows_schedule_topic("Reports.1")
    assert not narrowed.allows_schedule_topic("reports.1")  # case-sensitive, as ROUTES


# -- W4: absurd values are errors beside their field ------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


ABSURD = [
    ({"every": "1e12"}, "every", "ten years"),
    ({"every": "1e308"}, "every", "ten years"),
    ({"every": "0.0001"}, "every", "from 1 to"),
    ({"cron": "0 0 30 2 *", "every": ""}, "cron", "never fires"),
    ({"cron": "0 0 31 4,6,9,11 *", "every": ""}, "cron", "never fires"),
    ({"cron": "0 3 * * *", "every": "", "timezone": "Europe/" + "x" * 5000}, "timezone",
     "not a known time zone"),
    ({"jitter": "1e300"}, "jitter", "ten years"),
    ({"catch_up": str(10**30)}, "catch_up", "from 1 to 1000"),
    ({"priority": str(10**30)}, "priority", "priority must be between"),
    ({"payload": DEEP}, "payload", "Nested too deep"),
    ({"payload": "[" * 150 + "]" * 150}, "payload", "nested deeper than"),
    ({"partition_key": "k" * 300}, "partition_key", "partition_key"),
]


@pytest.mark.parametrize(("values", "field", "words"), ABSURD)
def test_absurd_message_schedule_values_are_errors_beside_their_field(
        values: dict[str, str], field: str, words: str) -> None:
    client = staff_with(*SCHEDULER)
    client.raise_request_exception = False
    response = client.post(reverse(ADD), form(**{"name": "absurd", "every": "60",
                                                 "topic": "reports", **values}))
    errors = form_errors(response)
    assert list(errors) == [field], errors
    assert words in errors[field][0], errors
    assert not StoredSchedule.objects.exists()


@pytest.mark.parametrize(("values", "field", "words"), [
    ({"args": DEEP}, "args", "Nested too deep"),
    ({"kwargs": '{"a": ' + "[" * 150 + "]" * 150 + "}"}, "kwargs", "more than 100 deep"),
    ({"args": "[" * 150 + "]" * 150}, "args", "more than 100 deep"),
    ({"args": '{"not": "a list"}'}, "args", "must be a list"),
])
def test_absurd_task_schedule_values_are_errors_beside_their_field(
        tasks: None, values: dict[str, str], field: str, words: str) -> None:
    client = staff_with(*SCHEDULER)
    client.raise_request_exception = False
    response = client.post(reverse(ADD), form(**{"name": "absurd", "every": "60",
                                                 "task": "tests.testapp.tasks.add", **values}))
    errors = form_errors(response)
    assert list(errors) == [field], errors
    assert words in errors[field][0], errors


@pytest.mark.parametrize(("entry", "check_id"), [
    ({"topic": "t", "every": 1e12}, "sqlqueue.E304"),
    ({"topic": "t", "every": 1e308}, "sqlqueue.E304"),
    ({"topic": "t", "every": 10**400}, "sqlqueue.E304"),
    ({"topic": "t", "every": 60, "jitter": 1e300}, "sqlqueue.E304"),
    ({"topic": "t", "cron": "0 0 30 2 *"}, "sqlqueue.E305"),
    ({"topic": "t", "cron": "0 0 * * *", "timezone": "x" * 5000}, "sqlqueue.E306"),
    ({"task": "tests.testapp.tasks.add", "every": 60, "kwargs": {"deep": nested(150)}},
     "sqlqueue.E309"),
])
def test_absurd_values_are_schedule_errors_in_settings_too(entry: dict[str, Any],
                                                          check_id: str) -> None:
    """The same values in ``SQLQUEUE["SCHEDULES"]``: ``manage.py check`` reports them with
    their id, no traceback."""
    from sqlqueue.scheduling.validation import schedule_errors

    settings, _ = validate({"SCHEDULES": {"absurd": entry}})
    assert settings is not None
    assert [error.check_id for error in schedule_errors(settings)] == [check_id]


def test_a_row_with_absurd_values_leaves_the_schedules_page_working() -> None:
    StoredSchedule.objects.create(name="absurd", entry={"topic": "t", "every": 1e308})
    StoredSchedule.objects.create(name="never", entry={"topic": "t", "cron": "0 0 30 2 *"})
    views = {view.name: view for view in schedule_overview(T0)}
    assert views["absurd"].schedule is None and views["never"].schedule is None
    client = staff_with("view_schedulestate", "view_storedschedule")
    client.raise_request_exception = False
    page = client.get(reverse("admin:sqlqueue_schedulestate_changelist"))
    assert page.status_code == 200 and "absurd" in page.text
    changelist = client.get(reverse("admin:sqlqueue_storedschedule_changelist"))
    assert changelist.status_code == 200 and "(not usable)" in changelist.text


def test_without_a_tasks_backend_the_form_offers_no_task() -> None:
    """No sqlqueue backend in TASKS (or no Tasks framework at all): an empty list, and
    the form still opens and saves a message schedule."""
    from sqlqueue.operations.stored_schedules import schedulable_tasks

    with override_settings(TASKS={}):
        assert schedulable_tasks() == []
        client = staff_with(*SCHEDULER)
        page = client.get(reverse(ADD)).text
        assert '<select name="task"' in page and "tests.testapp.tasks.add" not in page
        saved = client.post(reverse(ADD), form(name="beat", every="60", topic="beats"))
        assert saved.status_code == 302
