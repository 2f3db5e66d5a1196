"""Turning a ``queue_task_results`` row into Django's ``TaskResult``."""

from __future__ import annotations

import threading
from typing import Any

from django.utils.module_loading import autodiscover_modules

from sqlqueue.conf import get_settings
from sqlqueue.consuming.outcomes import dead_letter_id
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.integrations.tasks.compat import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from sqlqueue.integrations.tasks.models import TaskRecord
from sqlqueue.models import QueueMessage


class TaskAbandoned(SqlqueueError):
    """The error of a task whose last attempt never reported back: its worker was killed,
    or the attempt outlived its visibility timeout. Its message was dead-lettered."""


class TaskNotFound(SqlqueueError, LookupError):
    """A task path that does not name a ``@task`` (renamed, removed, or not a Task)."""


#: every ``@task`` of an sqlqueue backend defined in this process, by path
_TASKS: dict[str, Task[Any, Any]] = {}
_discovered = False
_discovery = threading.Lock()


def remember_task(task: Task[Any, Any]) -> None:
    _TASKS.setdefault(task.module_path, task)  # the decorated one, not a .using() copy


def registered_tasks() -> dict[str, Task[Any, Any]]:
    """Every ``@task`` of an sqlqueue backend defined in this process so far, by path."""
    return dict(_TASKS)


def load_task(task_path: str) -> Task[Any, Any]:
    """The ``@task`` a message names, looked up among the tasks defined in this process;
    a message never chooses a module to import. A task path comes from the message log,
    which anyone who can publish writes: importing what it names would run that module's
    import-time code in the worker (or in the web process calling ``get_result``). The
    project's task modules (each installed app's ``tasks``, a list that depends on the
    settings, never on a message) are imported once, at the first path not found."""
    task = _TASKS.get(task_path)
    if task is None:
        discover_tasks()
        task = _TASKS.get(task_path)
    if task is None:
        raise TaskNotFound(
            f"{task_path!r} is not a task of an sqlqueue backend defined in this process "
            "(decorate it with @task in an installed app's tasks module, or in a module "
            "the project imports at start-up); nothing was imported.")
    return task


def discover_tasks() -> None:
    """Import every installed app's ``tasks`` module, once (as the admin does for
    ``admin`` modules): defining their tasks fills the registry. Handler threads look up
    tasks at once: a second one waits for the first one's imports to finish (marked done
    only then), or it found the registry still empty and failed a task that exists."""
    global _discovered
    if _discovered:
        return
    with _discovery:
        if not _discovered:
            autodiscover_modules("tasks")
            _discovered = True


def declared_backend(task_path: str) -> str:
    """The backend alias the registered task was declared with (``@task(backend=...)``)."""
    return load_task(task_path).backend


def task_of(record: TaskRecord) -> Task[Any, Any]:
    """The task as it was enqueued: its queue, priority, schedule and backend."""
    return load_task(record.task_path).using(
        queue_name=record.queue_name, priority=record.priority, run_after=record.run_after,
        backend=record.backend,
    )


def to_task_result(record: TaskRecord, task: Task[Any, Any] | None = None,
                   status: str | None = None, extra_errors: tuple[TaskError, ...] = ()
                   ) -> TaskResult[Any, Any]:
    result: TaskResult[Any, Any] = TaskResult(
        task=task or task_of(record),
        id=record.id,
        status=TaskResultStatus(status or record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=[TaskError(**error) for error in record.errors] + list(extra_errors),
        worker_ids=list(record.worker_ids),
    )
    # Django keeps the return value out of __init__; its own backends set it like this.
    object.__setattr__(result, "_return_value", record.return_value)
    return result


def read_result(backend_alias: str, group: str, result_id: str) -> TaskResult[Any, Any]:
    """``get_result()``: one primary-key read, plus one unique-key read for a task that
    has not finished (was it dead-lettered without its worker reporting back?)."""
    alias = get_settings().DATABASE
    record = TaskRecord.objects.using(alias).of_backend(backend_alias).filter(
        pk=result_id).first() if isinstance(result_id, str) else None
    if record is None:
        raise TaskResultDoesNotExist(result_id)
    try:
        task = task_of(record)
    except TaskNotFound as exc:
        raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
    if record.is_finished:
        return to_task_result(record, task)
    dead_letter = _dead_letter_error(record, group, alias)
    if dead_letter is None:
        return to_task_result(record, task)
    abandoned = TaskError(exception_class_path=_path(TaskAbandoned), traceback=dead_letter)
    return to_task_result(record, task, status=TaskResultStatus.FAILED,
                          extra_errors=(abandoned,))


def _dead_letter_error(record: TaskRecord, group: str, alias: str) -> str | None:
    """The last error of the task's dead letter, if its message was dead-lettered."""
    topic = record.topic + get_settings().DLQ_SUFFIX
    row = QueueMessage.objects.using(alias).filter(
        topic=topic, partition_key=record.partition_key, id=dead_letter_id(record.id, group),
    ).values_list("last_error", flat=True).first()
    return row


def _path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
