"""Schedules whose ticks enqueue a Django task (``SQLQUEUE["SCHEDULES"][name]["task"]``):
the ``"task"`` target of ``sqlqueue.scheduling.targets``, registered at start-up.

A schedule's task is looked up among the ``@task``s the project defined (the registry of
``results.load_task``), never imported from the path it names: a stored schedule's path
is typed into the admin, and importing it would run any module's top-level code in the
web process (issue 53, W1). The runner looks it up again at each tick."""

from __future__ import annotations

from typing import Any

from sqlqueue.conf import get_settings
from sqlqueue.scheduling.definitions import Schedule, ScheduleError
from sqlqueue.scheduling.targets import register_target
from sqlqueue.storage.statements.schedules import PublishedTick


class TaskTarget:
    """A tick is the task's ``enqueue()``: its message goes into the log in the tick's
    transaction, since the task must run on sqlqueue's backend."""

    def check(self, schedule: Schedule) -> None:
        self._task(schedule)

    def _task(self, schedule: Schedule) -> Any:
        """The registered ``@task`` the schedule names, on sqlqueue's backend; raises
        ``ScheduleError`` (E308) otherwise, having imported nothing the schedule names."""
        from sqlqueue.integrations.tasks.backend import SQLQueueBackend
        from sqlqueue.integrations.tasks.compat import Task
        from sqlqueue.integrations.tasks.results import TaskNotFound, load_task

        where = f"SQLQUEUE['SCHEDULES'][{schedule.name!r}]['task'] {schedule.task!r}"
        try:
            task: Any = load_task(str(schedule.task))
        except TaskNotFound as exc:
            raise ScheduleError(
                "sqlqueue.E308", f"{where} is not a registered @task of sqlqueue's backend "
                "(defined with @task in an installed app's tasks module, or a module the "
                "project imports at start-up); nothing was imported.", "task") from exc
        if not isinstance(task, Task):  # pragma: no cover - the registry holds tasks only
            raise ScheduleError("sqlqueue.E308", f"{where} is not a Django @task.", "task")
        if not isinstance(task.get_backend(), SQLQueueBackend):
            raise ScheduleError(
                "sqlqueue.E308",
                f"{where} runs on backend {task.backend!r}, which is not sqlqueue's: a tick "
                "and its task must be stored in one transaction for each tick to run once.",
                "task")
        return task

    def enqueue(self, schedule: Schedule, tick_ms: int,
                metadata: dict[str, str]) -> PublishedTick:
        from sqlqueue.integrations.tasks.backend import message_metadata
        from sqlqueue.integrations.tasks.models import TaskRecord

        task = self._task(schedule)  # a row written by hand is refused here too
        with message_metadata(metadata):
            result = task.enqueue(*schedule.args, **dict(schedule.kwargs))
        record = TaskRecord.objects.using(get_settings().DATABASE).get(id=result.id)
        return PublishedTick(tick_ms, record.topic, record.partition_key,
                             int(record.message_offset), str(result.id))

    def choices(self) -> list[str]:
        """The paths of the registered ``@task``s of sqlqueue's backends (the installed
        apps' ``tasks`` modules are imported first, once: a list the settings decide)."""
        if not _backends():
            # No Tasks backend of ours: nothing to enqueue. Checked before importing the
            # backend, which needs Django's Tasks framework (absent on a plain Django 5.2).
            return []
        from sqlqueue.integrations.tasks.backend import SQLQueueBackend
        from sqlqueue.integrations.tasks.results import discover_tasks, registered_tasks

        discover_tasks()
        return sorted(path for path, task in registered_tasks().items()
                      if _is_ours(task, SQLQueueBackend))

    def owns_topic(self, topic: str) -> bool:
        """A topic of a Tasks backend of sqlqueue's: its ``TOPIC_PREFIX`` followed by
        anything (a queue, or a queue's dead letters), or one of its queues' topics when
        the prefix is empty. A message there is run as a task (issue 53, W2)."""
        for prefix, queues in _backends():
            if (prefix and topic.startswith(prefix)) or topic in {prefix + q for q in queues}:
                return True
        return False


def _backends() -> list[tuple[str, list[str]]]:
    """(topic prefix, queue names) of every sqlqueue backend in ``TASKS``, read from the
    settings (a backend whose OPTIONS are wrong counts with the default prefix)."""
    from sqlqueue.integrations.tasks.options import DEFAULT_TOPIC_PREFIX, parse_options
    from sqlqueue.integrations.tasks.registration import configured_backends, is_sqlqueue_backend

    found = []
    for alias, params in configured_backends():
        try:
            if not is_sqlqueue_backend(params.get("BACKEND")):
                continue
        except ImportError:
            found.append((DEFAULT_TOPIC_PREFIX, ["default"]))
            continue
        try:
            prefix = parse_options(alias, params.get("OPTIONS")).topic_prefix
        except Exception:  # its own check reports it; count it with the default prefix
            prefix = DEFAULT_TOPIC_PREFIX
        queues = params.get("QUEUES", ["default"]) or []
        found.append((prefix, [str(q) for q in queues]))
    return found


def _is_ours(task: Any, backend_class: type) -> bool:
    try:
        return isinstance(task.get_backend(), backend_class)
    except Exception:  # a task whose backend is gone from TASKS
        return False


def register_task_target() -> None:
    register_target("task", TaskTarget())
