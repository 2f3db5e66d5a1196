"""Tasks enqueued through Django's API, run by real ``manage.py runconsumer`` processes."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

pytest.importorskip("sqlqueue.integrations.tasks.compat")  # Django 5.2 without the backport

from sqlqueue.integrations.tasks.compat import TaskResultDoesNotExist, TaskResultStatus
from tests.acceptance.processes import runconsumer, wait_for
from tests.testapp import tasks
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def test_runconsumer_runs_tasks_retries_them_and_never_sees_a_rolled_back_one(
    processes: list,
) -> None:
    ok = tasks.create_order.enqueue("from-the-web")
    flaky = tasks.flaky.enqueue(failures=1)
    failing = tasks.always_fails.enqueue("out of stock")
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = tasks.create_order.enqueue("rolled-back")
        raise RuntimeError("the request failed after enqueueing")

    process = runconsumer("--group", "tasks", "--until-empty", "--threads", "2")
    processes.append(process)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err

    assert list(Order.objects.values_list("reference", flat=True)) == ["from-the-web"]
    done = tasks.create_order.get_result(ok.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.worker_ids[0].endswith(f"-{process.pid}")  # hostname-pid of the worker
    assert tasks.flaky.get_result(flaky.id).return_value == 2
    failed = tasks.always_fails.get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3
    assert all("out of stock" in e.traceback for e in failed.errors)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.create_order.get_result(lost.id)
    assert "tasks:tasks.default: 2 acked, 3 retried, 1 dead-lettered" in out


def test_a_running_worker_picks_up_deferred_tasks_when_due(processes: list) -> None:
    process = runconsumer("--group", "tasks", settings={"POLL_INTERVAL": 0.05})
    processes.append(process)
    run_after = timezone.now() + timedelta(seconds=4)
    deferred = tasks.add.using(run_after=run_after).enqueue(40, 2)
    now = tasks.add.enqueue(1, 1)

    wait_for(lambda: tasks.add.get_result(now.id).status == TaskResultStatus.SUCCESSFUL,
             what="the immediate task")
    checked_at = timezone.now()
    if checked_at < run_after - timedelta(seconds=0.5):  # a slow start may use up the wait
        assert tasks.add.get_result(deferred.id).status == TaskResultStatus.READY
    wait_for(lambda: tasks.add.get_result(deferred.id).status == TaskResultStatus.SUCCESSFUL,
             what="the deferred task")
    result = tasks.add.get_result(deferred.id)
    assert result.return_value == 42
    assert result.started_at is not None and result.started_at >= run_after

    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
