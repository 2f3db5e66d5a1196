"""The Django Tasks backend against a real database, with the workers of ``runconsumer``
running in this process: what Django expects of a backend (enqueue, defer, priority,
results, failures with tracebacks, retries, rollback), and what sqlqueue adds (atomic
tasks, strict order by partition key, dead letters and replay, retention)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

pytest.importorskip("sqlqueue.integrations.tasks.compat",  # Django 5.2 without the backport
                    exc_type=ImportError)

from sqlqueue import InvalidMessage
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.integrations.tasks.compat import (
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
)
from sqlqueue.integrations.tasks.models import Status, TaskRecord
from sqlqueue.models import QueueMessage
from sqlqueue.operations.dead_letters import replay_dead_letter
from sqlqueue.tasks import partition_key
from tests.conftest import stored_messages
from tests.integration.consuming_helpers import drain, fast_settings
from tests.testapp import tasks
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def run_tasks(group: str = "tasks", **kwargs: Any) -> None:
    drain([group], **kwargs)


def test_a_task_is_a_message_until_a_worker_runs_it() -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and result.backend == "default"
    (message,) = stored_messages("tasks.default")
    assert message["id"] == result.id
    assert message["payload"] == {"task": "tests.testapp.tasks.add", "args": [2, 3],
                                  "kwargs": {}}
    assert message["priority"] == 100  # Django's default priority 0
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY

    run_tasks()

    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.attempts == 1 and done.errors == []
    assert done.args == [2, 3] and done.kwargs == {}
    assert done.enqueued_at is not None and done.started_at is not None
    assert done.enqueued_at <= done.started_at <= done.finished_at  # type: ignore[operator]
    assert done.last_attempted_at == done.started_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_queues_are_topics_and_each_has_a_consumer() -> None:
    result = tasks.send_email.enqueue("ada@example.com")
    assert stored_messages("tasks.emails")[0]["id"] == result.id
    consumers = {(c.group, c.topic) for c in select_consumers(["tasks"])}
    assert consumers == {("tasks", "tasks.default"), ("tasks", "tasks.emails")}
    run_tasks()
    assert tasks.send_email.get_result(result.id).return_value == "sent to ada@example.com"


def test_async_tasks_run_too() -> None:
    result = tasks.add_later.enqueue(20, 22)
    run_tasks()
    assert tasks.add_later.get_result(result.id).return_value == 42


def test_async_enqueue_and_get_result() -> None:
    from asgiref.sync import async_to_sync

    result = async_to_sync(tasks.add.aenqueue)(5, 6)
    run_tasks()
    done = async_to_sync(tasks.add.aget_result)(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 11
    async_to_sync(result.arefresh)()
    assert result.return_value == 11


def test_a_task_enqueued_in_a_rolled_back_transaction_never_exists() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = tasks.create_order.enqueue("rolled-back")
        raise RuntimeError("the view failed after enqueueing")
    kept = tasks.create_order.enqueue("kept")
    run_tasks()
    assert list(Order.objects.values_list("reference", flat=True)) == ["kept"]
    with pytest.raises(TaskResultDoesNotExist):
        tasks.create_order.get_result(lost.id)
    assert not QueueMessage.objects.filter(id=lost.id).exists()
    assert tasks.create_order.get_result(kept.id).status == TaskResultStatus.SUCCESSFUL


def test_run_after_defers_the_task() -> None:
    run_after = timezone.now() + timedelta(seconds=3)
    result = tasks.add.using(run_after=run_after).enqueue(1, 1)
    run_tasks()  # --until-empty does not wait for scheduled work
    waiting = tasks.add.get_result(result.id)
    assert waiting.status == TaskResultStatus.READY and waiting.started_at is None
    assert waiting.task.run_after == run_after
    deadline = time.monotonic() + 30
    while tasks.add.get_result(result.id).status != TaskResultStatus.SUCCESSFUL:
        assert time.monotonic() < deadline, "the deferred task never ran"
        time.sleep(0.2)
        run_tasks()
    done = tasks.add.get_result(result.id)
    assert done.started_at is not None and done.started_at >= run_after


def test_higher_priority_runs_first() -> None:
    with partition_key("one-partition"):  # what a worker fetched together, it orders
        for n in range(3):
            tasks.create_order.using(priority=-10).enqueue(f"low-{n}")
        tasks.create_order.using(priority=100).enqueue("urgent")
        for n in range(3):
            tasks.create_order.using(priority=10).enqueue(f"high-{n}")
    priorities = [m["priority"] for m in stored_messages("tasks.default")]
    assert priorities == [110, 110, 110, 0, 90, 90, 90]
    run_tasks(threads=1)
    assert list(Order.objects.order_by("pk").values_list("reference", flat=True)) == [
        "urgent", "high-0", "high-1", "high-2", "low-0", "low-1", "low-2"]


def test_a_failing_task_is_retried_then_failed_with_every_traceback() -> None:
    result = tasks.always_fails.enqueue("the disk is full")
    run_tasks()
    failed = tasks.always_fails.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 3  # OPTIONS["MAX_ATTEMPTS"]
    assert len(failed.errors) == 3
    for error in failed.errors:
        assert error.exception_class is ValueError
        assert "raise ValueError(reason)" in error.traceback
        assert "the disk is full" in error.traceback
    assert failed.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018
    # The message is a dead letter of the "tasks" group, like any consumer's.
    dead = QueueMessage.objects.get(topic="tasks.default_dlq")
    assert (dead.consumer_group, dead.failure_count) == ("tasks", 3)
    assert "the disk is full" in dead.last_error


def test_failure_log_lines_name_the_task(caplog: pytest.LogCaptureFixture) -> None:
    """Trial F17 (issue 53): the handler-failure and dead-letter lines say which task
    failed, not only the backend's topic and offset (on Django 5.2 no other line does):
    each failure's line at DEBUG, and the first of an interval's at WARNING (a flood's
    lines, issue 56)."""
    caplog.set_level(logging.DEBUG, logger="sqlqueue")
    tasks.always_fails.enqueue("the disk is full")
    run_tasks()

    def of(event: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", "") == event]

    failures = of("sqlqueue.handler.failed")
    assert len(failures) == 3 and {r.levelno for r in failures} == {logging.DEBUG}
    assert all(r.subject == "task tests.testapp.tasks.always_fails" for r in failures)
    assert ("(attempt 1), task tests.testapp.tasks.always_fails: ValueError"
            in failures[0].getMessage())
    first, *_ = of("sqlqueue.handler.failures")
    assert first.levelno == logging.WARNING and first.count == 1
    assert ("(attempt 1), task tests.testapp.tasks.always_fails: ValueError: the disk is "
            "full" in first.getMessage())
    (dead,) = of("sqlqueue.message.dead_lettered")
    assert "(task tests.testapp.tasks.always_fails) for group 'tasks'" in dead.getMessage()
    assert dead.subject == "task tests.testapp.tasks.always_fails"
    (line,) = of("sqlqueue.messages.dead_lettered")
    assert line.levelno == logging.ERROR and line.count == 1
    assert "(task tests.testapp.tasks.always_fails) for group 'tasks'" in line.getMessage()


def test_a_flaky_task_succeeds_on_a_retry() -> None:
    result = tasks.flaky.enqueue(failures=2)
    run_tasks()
    done = tasks.flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 3 and done.attempts == 3
    assert [e.exception_class for e in done.errors] == [ConnectionError, ConnectionError]


def test_retry_is_a_request_not_an_error() -> None:
    result = tasks.asks_to_wait.enqueue()
    run_tasks()
    done = tasks.asks_to_wait.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 2
    assert done.attempts == 2 and done.errors == []


def test_reject_fails_at_once_and_a_bad_return_value_is_a_failure() -> None:
    rejected = tasks.rejects.enqueue()
    bad = tasks.returns_a_set.enqueue()
    run_tasks()
    result = tasks.rejects.get_result(rejected.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert result.errors[0].exception_class_path == "sqlqueue.consuming.message.Reject"
    unsupported = tasks.returns_a_set.get_result(bad.id)
    assert unsupported.status == TaskResultStatus.FAILED
    assert "Unsupported type" in unsupported.errors[-1].traceback


def test_a_return_value_no_database_stores_is_a_named_failure() -> None:
    """I15 for tasks: a NUL in the return value fails the attempt with an error that says
    so, alike on every database (PostgreSQL raised a bare DataError)."""
    result = tasks.returns_text_with_a_nul.enqueue()
    run_tasks()
    failed = tasks.returns_text_with_a_nul.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert "contains a NUL (U+0000)" in failed.errors[-1].traceback


def test_a_dead_lettered_task_can_be_replayed_and_then_succeed() -> None:
    result = tasks.needs_order.enqueue("ORD-1")
    run_tasks()
    assert tasks.needs_order.get_result(result.id).status == TaskResultStatus.FAILED
    Order.objects.create(reference="ORD-1")
    dead = QueueMessage.objects.get(topic="tasks.default_dlq")
    replay_dead_letter(dead.offset)  # what the admin's "replay" action does
    run_tasks()
    done = tasks.needs_order.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "ORD-1"
    assert done.attempts == 4 and len(done.errors) == 3  # three failed, then one more


def test_a_worker_that_stopped_on_the_last_attempt_shows_as_failed() -> None:
    """The runner dead-letters a message whose attempts never reported back, without
    calling the task: the result, left RUNNING, reads as FAILED from then on."""
    result = tasks.add.enqueue(1, 2)
    record = TaskRecord.objects.get(pk=result.id)
    TaskRecord.objects.filter(pk=result.id).update(status=Status.RUNNING)
    QueueMessage.objects.create(
        topic="tasks.default_dlq", partition_key=record.partition_key,
        id=f"{result.id}@tasks", payload=b"{}", created_at=0, published_at=0,
        consumer_group="tasks", original_topic="tasks.default",
        last_error="Gave up after 3 attempt(s) that never completed.",
    )
    failed = tasks.add.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class_path.endswith(".TaskAbandoned")
    assert "never completed" in failed.errors[-1].traceback


def test_a_redelivery_of_a_finished_task_does_not_run_it_again() -> None:
    """A worker that died after committing the result but before the ack: the message
    comes back, and is acked without running the task a second time."""
    result = tasks.create_order.enqueue("once")
    TaskRecord.objects.filter(pk=result.id).update(status=Status.SUCCESSFUL)
    run_tasks()
    assert not Order.objects.exists()
    assert tasks.create_order.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_atomic_tasks_commit_their_writes_with_the_result() -> None:
    ok = tasks.create_order_atomically.enqueue("atomic-ok")
    failing = tasks.create_order_atomically.enqueue("atomic-fail", fail=True)
    assert stored_messages("strict.default")[0]["id"] == ok.id
    run_tasks("strict-tasks")
    assert list(Order.objects.values_list("reference", flat=True)) == ["atomic-ok"]
    assert tasks.create_order_atomically.get_result(ok.id).status == "SUCCESSFUL"
    failed = tasks.create_order_atomically.get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3


def test_ordered_backend_runs_a_partition_in_enqueue_order() -> None:
    with partition_key("customer-7"):
        results = [tasks.create_order_atomically.enqueue(f"o-{n}") for n in range(6)]
    run_tasks("strict-tasks", threads=4)
    assert list(Order.objects.order_by("pk").values_list("reference", flat=True)) == [
        f"o-{n}" for n in range(6)]
    assert {m["partition_key"] for m in stored_messages("strict.default")} == {"customer-7"}
    for result in results:
        assert tasks.create_order_atomically.get_result(result.id).status == "SUCCESSFUL"


def test_bad_arguments_are_refused_before_anything_is_written() -> None:
    with transaction.atomic():
        with pytest.raises(TypeError, match="must be JSON"):
            tasks.add.enqueue(timezone.now(), 1)
        with pytest.raises(InvalidMessage, match="partition_key"), partition_key(""):
            tasks.add.enqueue(1, 1)
        Order.objects.create(reference="still-usable")  # the transaction still works
    assert not QueueMessage.objects.exists() and not TaskRecord.objects.exists()


def test_unknown_and_mismatched_results() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("no-such-id")
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.create_order.get_result(result.id)
    with pytest.raises(TaskResultDoesNotExist):  # results are per backend
        task_backends["strict"].get_result(result.id)


def test_old_results_are_garbage_collected() -> None:
    finished = tasks.add.enqueue(1, 1)
    waiting = tasks.add.using(run_after=timezone.now() + timedelta(days=30)).enqueue(2, 2)
    run_tasks()
    recent = tasks.add.enqueue(3, 3)
    run_tasks()
    long_ago = timezone.now() - timedelta(days=8)  # RESULT_RETENTION is 7 days
    TaskRecord.objects.filter(pk__in=[finished.id, waiting.id]).update(updated_at=long_ago)
    collector = GarbageCollector(fast_settings(), connection.alias, {})
    with connection.cursor() as cursor:
        collector.collect(cursor, force=True)
    assert collector.results_deleted == 1
    assert set(TaskRecord.objects.values_list("pk", flat=True)) == {waiting.id, recent.id}


def test_backend_configuration_errors_name_the_problem() -> None:
    from unittest import mock

    from sqlqueue.exceptions import ConfigurationError
    from sqlqueue.integrations.tasks.registration import register_backend
    from sqlqueue.tasks import SQLQueueBackend

    # A bad entry never raises while Django builds it (start-up, checks): check E202
    # reports it, and enqueue() refuses before any write.
    empty = SQLQueueBackend("x", {"QUEUES": []})
    with pytest.raises(ConfigurationError, match=r"TASKS\['x'\]\['QUEUES'\] is empty"):
        empty.enqueue(tasks.add, (1, 2), {})
    with pytest.raises(ConfigurationError, match=r"gives no usable topic.*control character"):
        SQLQueueBackend("x", {"QUEUES": ["a\nb"]}).ensure_usable()
    with pytest.raises(ConfigurationError, match="another OPTIONS\\['TOPIC_PREFIX'\\]"):
        register_backend(SQLQueueBackend("clash", {"QUEUES": ["default"]}))
    backend = SQLQueueBackend("x", {})
    assert backend.check() == []
    with mock.patch("sqlqueue.integrations.tasks.backend.apps.is_installed", return_value=False):
        (error,) = backend.check()
    assert error.id == "sqlqueue.E201"



def test_the_admin_shows_results_read_only_and_escaped() -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    failed = tasks.always_fails.enqueue("<script>alert(1)</script>")
    done = tasks.add.enqueue(1, 2)
    run_tasks()
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    listing = client.get(reverse("admin:sqlqueue_taskrecord_changelist"))
    assert listing.status_code == 200
    assert "tests.testapp.tasks.always_fails" in listing.text and done.id in listing.text
    page = client.get(reverse("admin:sqlqueue_taskrecord_change", args=[failed.id]))
    assert page.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "<script>alert(1)" not in page.text
    assert "builtins.ValueError" in page.text
    # Trial F6 (issue 53): three attempts that failed alike are one entry, one traceback.
    assert "Attempts 1-3 (3 times the same error)</strong>: builtins.ValueError" in page.text
    assert page.text.count("raise ValueError(reason)") == 1
    # Trial F15: no schema help texts, no (always empty) History button.
    assert "TASKS alias." not in page.text and "One entry per attempt." not in page.text
    assert "historylink" not in page.text
    assert client.get(reverse("admin:sqlqueue_taskrecord_add")).status_code == 403
    # Issue 37: the list says why a task failed; its page leads to running it again
    # (issue 42: its Retry button, which replays its dead letter).
    assert "ValueError: &lt;script&gt;alert(1)&lt;/script&gt;" in listing.text
    retry = reverse("admin:sqlqueue_taskrecord_retry_one", args=[failed.id])
    assert f'href="{retry}" id="sqlqueue-retry-task"' in page.text
    done_page = client.get(reverse("admin:sqlqueue_taskrecord_change", args=[done.id]))
    assert 'id="sqlqueue-retry-task"' not in done_page.text
    client.post(retry, {"confirmed": "yes"})
    run_tasks()
    assert tasks.always_fails.get_result(failed.id).attempts == 6  # ran again (3 more)
    again = client.get(reverse("admin:sqlqueue_taskrecord_change", args=[failed.id]))
    assert "Attempts 1-6 (6 times the same error)" in again.text
    assert again.text.count("raise ValueError(reason)") == 1


def test_the_task_page_groups_only_consecutive_identical_errors() -> None:
    from sqlqueue.integrations.tasks.admin import error_groups

    disk = {"exception_class_path": "builtins.OSError", "traceback": "OSError: disk"}
    net = {"exception_class_path": "builtins.ConnectionError", "traceback": "refused"}
    assert error_groups([disk, disk, net, disk], 4) == [
        (1, 2, disk), (3, 3, net), (4, 4, disk)]
    # The record keeps the newest errors only: numbered from the attempts they belong to.
    assert error_groups([disk] * 25, 30) == [(6, 30, disk)]
    assert error_groups([], 0) == []


@pytest.mark.parametrize("path", ["tests.import_canary.run", "os.system",
                                  "tests.testapp.models.Order",
                                  # inside an installed app, not imported yet (F3, issue 36)
                                  "tests.testapp.import_canary.run"])
def test_a_task_path_that_names_no_task_is_a_failure_without_an_import(path: str) -> None:
    import sys

    assert "tests.testapp.import_canary" not in sys.modules

    from sqlqueue import send_message
    from sqlqueue.integrations.tasks.backend import SQLQueueBackend

    backend = task_backends["default"]
    assert isinstance(backend, SQLQueueBackend)
    sent = send_message(backend.topic("default"), {"task": path, "args": ["id"], "kwargs": {}})
    run_tasks()
    record = TaskRecord.objects.get(pk=sent.id)
    assert record.status == Status.FAILED
    assert "is not a task of an sqlqueue backend" in record.errors[-1]["traceback"]
    assert "tests.import_canary" not in sys.modules
    with pytest.raises(Exception, match="is not a task of an sqlqueue backend"):
        backend.get_result(sent.id)  # the web process refuses it too
    assert "tests.import_canary" not in sys.modules
    assert "tests.testapp.import_canary" not in sys.modules


def test_a_task_published_on_another_backends_topic_is_refused() -> None:
    """F3: ``add`` is a task of backend "default"; published by hand on the ATOMIC,
    ordered backend's topic, the strict worker refuses it rather than run it under
    options it was not written for."""
    from sqlqueue import send_message
    from sqlqueue.integrations.tasks.backend import SQLQueueBackend

    strict = task_backends["strict"]
    assert isinstance(strict, SQLQueueBackend)
    sent = send_message(strict.topic("default"),
                        {"task": "tests.testapp.tasks.add", "args": [1, 2], "kwargs": {}})
    run_tasks("strict-tasks")
    record = TaskRecord.objects.get(pk=sent.id)
    assert record.status == Status.FAILED and record.return_value is None
    assert "is a task of backend 'default', not of 'strict'" in record.errors[-1]["traceback"]
    assert QueueMessage.objects.filter(topic=strict.topic("default") + "_dlq").count() == 1


def test_a_record_of_another_backend_is_not_run_by_this_worker() -> None:
    """A message whose result row names another backend (its id forged to match)."""
    from sqlqueue import send_message
    from sqlqueue.integrations.tasks.backend import SQLQueueBackend

    result = tasks.add.enqueue(1, 2)  # a row of backend "default"
    strict = task_backends["strict"]
    assert isinstance(strict, SQLQueueBackend)
    send_message(strict.topic("default"),
                 {"task": "tests.testapp.tasks.add", "args": [1, 2], "kwargs": {}},
                 id=result.id)
    run_tasks("strict-tasks")
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == Status.FAILED
    assert "was enqueued on backend 'default', not on 'strict'" in (
        record.errors[-1]["traceback"])


def test_tasks_of_installed_apps_still_resolve_by_path() -> None:
    from sqlqueue.integrations.tasks.results import load_task

    assert load_task("tests.testapp.tasks.add") == tasks.add


@pytest.mark.parametrize(("depth", "error"), [(150, InvalidMessage), (100_000, TypeError)])
def test_task_arguments_nested_too_deeply_are_refused(depth: int, error: type) -> None:
    argument: object = 1
    for _ in range(depth):
        argument = [argument]
    with pytest.raises(error, match="nested"):
        tasks.add.enqueue(argument, 1)
    assert not TaskRecord.objects.exists()
