"""Issue 42: a failed task retried or discarded from the Task results page (or through
sqlqueue.integrations.tasks.repairs), with the dead letters' permissions and a
confirmation page, and the links between a failed task and its dead letter."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

pytest.importorskip("sqlqueue.integrations.tasks.compat",  # Django 5.2 without the backport
                    exc_type=ImportError)

from sqlqueue.integrations.tasks.compat import TaskResultDoesNotExist, TaskResultStatus
from sqlqueue.integrations.tasks.models import Status, TaskRecord
from sqlqueue.integrations.tasks.repairs import (
    NotRetryable,
    dead_letter_of,
    discard_task,
    retry_task,
    retry_tasks,
    task_of_dead_letter,
)
from sqlqueue.models import DeadLetter
from tests.integration.consuming_helpers import drain
from tests.testapp import tasks
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def run_tasks() -> None:
    drain(["tasks"])


def failed_order_task() -> Any:
    result = tasks.needs_order.enqueue("ORD-7")
    run_tasks()
    assert tasks.needs_order.get_result(result.id).status == TaskResultStatus.FAILED
    return result


def test_a_retried_task_is_ready_at_once_then_runs_again_under_its_id() -> None:
    result = failed_order_task()
    record = TaskRecord.objects.get(pk=result.id)
    dead = dead_letter_of(record)
    assert dead is not None and task_of_dead_letter(dead) == record

    new_offset = retry_task(result.id)

    record.refresh_from_db()
    assert record.status == Status.READY and record.finished_at is None
    assert not DeadLetter.objects.filter(offset=dead.offset).exists()
    assert record.message_offset < new_offset
    Order.objects.create(reference="ORD-7")
    run_tasks()
    done = tasks.needs_order.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.attempts == 4
    assert len(done.errors) == 3
    with pytest.raises(NotRetryable, match="has no dead letter"):
        retry_task(result.id)  # succeeded: nothing to replay


def test_a_task_that_fails_again_after_a_retry_can_be_retried_again() -> None:
    result = failed_order_task()
    retry_task(result.id)
    run_tasks()
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == Status.FAILED and len(record.worker_ids) == 6
    dead = dead_letter_of(record)
    assert dead is not None and task_of_dead_letter(dead) == record
    assert retry_tasks([result.id, result.id, "no-such-id"]).done == 1


def test_a_discarded_task_has_neither_dead_letter_nor_result() -> None:
    result = failed_order_task()
    waiting = tasks.add.enqueue(1, 1)
    discard_task(result.id)
    assert not DeadLetter.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.needs_order.get_result(result.id)
    with pytest.raises(NotRetryable, match="discarded or collected"):
        discard_task(result.id)
    with pytest.raises(NotRetryable, match=r"\(READY\) has no dead letter"):
        discard_task(waiting.id)
    assert TaskRecord.objects.filter(pk=waiting.id).exists()


def operator(*perms: str) -> Client:
    user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    for perm in ("view_taskrecord", "view_deadletter", *perms):
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client = Client()
    client.force_login(user)
    return client


def test_the_results_list_says_status_attempts_duration_and_why() -> None:
    result = failed_order_task()
    tasks.add.enqueue(2, 2)
    run_tasks()
    listing = operator().get(reverse("admin:sqlqueue_taskrecord_changelist"))
    assert listing.status_code == 200
    for column in ("column-status", "column-attempts", "column-duration",
                   "column-last_error"):
        assert column in listing.text
    assert "LookupError: no order ORD-7" in listing.text
    assert " s</td>" in listing.text  # a finished task's duration, in seconds
    assert result.id in listing.text  # each row links to the task's page by its id


def test_retry_from_the_task_page_asks_then_replays() -> None:
    result = failed_order_task()
    dead = DeadLetter.objects.get()
    client = operator("replay_deadletter")
    page = client.get(reverse("admin:sqlqueue_taskrecord_change", args=[result.id]))
    retry_url = reverse("admin:sqlqueue_taskrecord_retry_one", args=[result.id])
    assert 'id="sqlqueue-retry-task"' in page.text and retry_url in page.text
    assert 'id="sqlqueue-discard-task"' not in page.text  # no discard permission
    dead_url = reverse("admin:sqlqueue_deadletter_change", args=[dead.offset])
    assert f'id="sqlqueue-task-dead-letter" href="{dead_url}"' in page.text
    # ... and back, from the dead letter's page to the task's.
    dead_page = client.get(dead_url)
    task_url = reverse("admin:sqlqueue_taskrecord_change", args=[result.id])
    assert f'id="sqlqueue-dead-letter-task" href="{task_url}"' in dead_page.text

    asked = client.get(retry_url)
    assert asked.status_code == 200 and "Retry it?" in asked.text
    assert DeadLetter.objects.exists()  # asking changes nothing
    done = client.post(retry_url, {"confirmed": "yes"}, follow=True)
    assert "Retried 1 task(s)." in done.text
    assert TaskRecord.objects.get(pk=result.id).status == Status.READY
    again = client.post(retry_url, {"confirmed": "yes"}, follow=True)
    assert "has no dead letter" in again.text


def test_the_actions_need_the_dead_letter_permissions() -> None:
    result = failed_order_task()
    client = operator()
    page = client.get(reverse("admin:sqlqueue_taskrecord_change", args=[result.id]))
    assert "sqlqueue-retry-task" not in page.text and "sqlqueue-discard-task" not in page.text
    for name in ("retry_one", "discard_one"):
        url = reverse(f"admin:sqlqueue_taskrecord_{name}", args=[result.id])
        assert client.get(url).status_code == 403
        assert client.post(url, {"confirmed": "yes"}).status_code == 403
    listing = client.get(reverse("admin:sqlqueue_taskrecord_changelist"))
    assert 'value="retry"' not in listing.text and 'value="discard"' not in listing.text
    assert DeadLetter.objects.count() == 1


def test_the_list_actions_retry_and_discard_after_confirmation() -> None:
    first, second = failed_order_task(), failed_order_task()
    done = tasks.add.enqueue(1, 2)
    run_tasks()
    client = operator("replay_deadletter", "discard_deadletter")
    changelist = reverse("admin:sqlqueue_taskrecord_changelist")
    retried = client.post(changelist, {"action": "retry", "_selected_action": [first.id, done.id]},
                          follow=True)
    assert "Retried 1 task(s)." in retried.text and "1 had no dead letter" in retried.text
    asked = client.post(changelist, {"action": "discard", "_selected_action": [second.id]})
    assert asked.status_code == 200 and "Yes, discard them" in asked.text
    assert TaskRecord.objects.filter(pk=second.id).exists()
    client.post(changelist, {"action": "discard", "_selected_action": [second.id],
                             "confirmed": "yes"})
    assert not TaskRecord.objects.filter(pk=second.id).exists()
    assert set(TaskRecord.objects.values_list("status", flat=True)) == {
        Status.READY, Status.SUCCESSFUL}
    assert not DeadLetter.objects.exists()


def test_the_dead_letters_list_and_page_name_the_task() -> None:
    """Issue 53, F17: a Tasks backend's dead letter said only "tasks.default /
    default-5"; the list and its page name the task, from the envelope (so even once its
    result row is gone)."""
    failed_order_task()
    dead = DeadLetter.objects.get()
    client = operator()
    named = "task tests.testapp.tasks.needs_order"
    listing = client.get(reverse("admin:sqlqueue_deadletter_changelist")).text
    assert f'<span class="sqlqueue-subject">{named}</span>' in listing
    TaskRecord.objects.all().delete()  # collected: the envelope still names it
    page = client.get(reverse("admin:sqlqueue_deadletter_change", args=[dead.offset])).text
    assert "Asks for" in page and named in page
