"""Schedules whose ticks enqueue a Django task (``SQLQUEUE["SCHEDULES"][name]["task"]``):
the ``"task"`` target of ``sqlqueue.scheduling.targets``, registered at start-up."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from sqlqueue.conf import get_settings
from sqlqueue.scheduling.definitions import Schedule, ScheduleError
from sqlqueue.scheduling.targets import register_target
from sqlqueue.storage.statements.schedules import PublishedTick


class TaskTarget:
    """A tick is the task's ``enqueue()``: its message goes into the log in the tick's
    transaction, since the task must run on sqlqueue's backend."""

    def check(self, schedule: Schedule) -> None:
        from sqlqueue.integrations.tasks.backend import SQLQueueBackend
        from sqlqueue.integrations.tasks.compat import Task

        where = f"SQLQUEUE['SCHEDULES'][{schedule.name!r}]['task'] {schedule.task!r}"
        try:
            task: Any = import_string(str(schedule.task))
        except ImportError as exc:
            raise ScheduleError("sqlqueue.E308", f"{where} cannot be imported: {exc}") from exc
        if not isinstance(task, Task):
            raise ScheduleError("sqlqueue.E308", f"{where} is not a Django @task.")
        if not isinstance(task.get_backend(), SQLQueueBackend):
            raise ScheduleError(
                "sqlqueue.E308",
                f"{where} runs on backend {task.backend!r}, which is not sqlqueue's: a tick "
                "and its task must be stored in one transaction for each tick to run once.")

    def enqueue(self, schedule: Schedule, tick_ms: int,
                metadata: dict[str, str]) -> PublishedTick:
        from sqlqueue.integrations.tasks.backend import message_metadata
        from sqlqueue.integrations.tasks.models import TaskRecord

        task = import_string(str(schedule.task))
        with message_metadata(metadata):
            result = task.enqueue(*schedule.args, **dict(schedule.kwargs))
        record = TaskRecord.objects.using(get_settings().DATABASE).get(id=result.id)
        return PublishedTick(tick_ms, record.topic, record.partition_key,
                             int(record.message_offset), str(result.id))


def register_task_target() -> None:
    register_target("task", TaskTarget())
