"""``SQLQueueBackend``: Django's task backend API on sqlqueue (docs/guides/tasks.md).

``enqueue()`` publishes the task as a message on topic ``TOPIC_PREFIX + queue_name`` and
writes its result row, in the caller's transaction: a task enqueued in a block that
rolls back never exists, and so never runs. ``manage.py runconsumer`` runs the tasks
(``sqlqueue.integrations.tasks.worker``); ``get_result()`` reads the result row.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage
from django.core.checks import Error as CheckError
from django.db import transaction
from django.utils import timezone

from sqlqueue.conf import get_settings, validate
from sqlqueue.exceptions import ConfigurationError, InvalidMessage
from sqlqueue.integrations.tasks.compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
    task_enqueued,
)
from sqlqueue.integrations.tasks.envelope import seal
from sqlqueue.integrations.tasks.options import TaskOptions, message_priority, parse_options
from sqlqueue.publishing.api import send_message
from sqlqueue.publishing.messages import check_topic

_partition_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sqlqueue_task_partition_key", default=None)


@contextmanager
def partition_key(key: str) -> Iterator[None]:
    """Tasks enqueued inside this block share the partition ``key``: with
    ``OPTIONS["ORDERED"]`` they run one at a time, in the order they were enqueued."""
    token = _partition_key.set(key)
    try:
        yield
    finally:
        _partition_key.reset(token)


_metadata: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "sqlqueue_task_metadata", default=None)


@contextmanager
def message_metadata(metadata: dict[str, str]) -> Iterator[None]:
    """Tasks enqueued inside this block carry ``metadata`` on their messages (a schedule
    marks its tick this way)."""
    token = _metadata.set(metadata)
    try:
        yield
    finally:
        _metadata.reset(token)


class SQLQueueBackend(BaseTaskBackend):
    supports_defer = True  # run_after -> the message's deliver_after
    supports_async_task = True  # coroutines run on the worker's thread (async_to_sync)
    supports_get_result = True  # from any process: the result row
    supports_priority = True  # -100..100 -> sqlqueue priority 200..0

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.sqlqueue_options: TaskOptions = TaskOptions()
        #: What is wrong with this TASKS entry. Django builds backends while it starts (our
        #: AppConfig.ready(), its own checks), where an exception would kill every
        #: manage.py command with a traceback; so a bad entry is kept here, reported by
        #: ``manage.py check`` as sqlqueue.E202 and raised by ``enqueue()``.
        self.configuration_error: str | None = None
        try:
            self.sqlqueue_options = parse_options(alias, self.options)
            self._check_queues()
        except ConfigurationError as exc:
            self.configuration_error = str(exc)

    def _check_queues(self) -> None:
        if not self.queues:
            raise ConfigurationError(
                f"TASKS[{self.alias!r}]['QUEUES'] is empty: name the queues to run, so that "
                "runconsumer has a consumer for each (the default is ['default'])."
            )
        conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
        if conf is None:
            return  # the settings check reports SQLQUEUE's own errors (sqlqueue.E001-E007)
        for queue_name in sorted(self.queues):
            try:
                check_topic(self.topic(queue_name), conf)
            except InvalidMessage as exc:
                raise ConfigurationError(
                    f"TASKS[{self.alias!r}]: queue {queue_name!r} gives no usable topic: {exc}"
                ) from exc

    def ensure_usable(self) -> None:
        """Raise the ``ConfigurationError`` of a bad TASKS entry, before any write."""
        if self.configuration_error is not None:
            raise ConfigurationError(self.configuration_error)

    def topic(self, queue_name: str) -> str:
        return self.sqlqueue_options.topic(queue_name)

    # -- enqueue ------------------------------------------------------------------------
    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django calls this for every ``@task`` of this backend as it is defined: the
        worker resolves only paths of tasks seen here (issue 14, F3)."""
        super().validate_task(task)
        from sqlqueue.integrations.tasks.results import remember_task

        remember_task(task)

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        from sqlqueue.integrations.tasks.models import Status, TaskRecord

        self.ensure_usable()
        self.validate_task(task)
        envelope = seal(task.module_path, args, kwargs)  # refused before any write
        now = timezone.now()
        result: TaskResult[Any, Any] = TaskResult(
            task=task, id=str(uuid.uuid4()), status=TaskResultStatus.READY, enqueued_at=now,
            started_at=None, finished_at=None, last_attempted_at=None, args=envelope.args,
            kwargs=envelope.kwargs, backend=self.alias, errors=[], worker_ids=[],
        )
        alias = get_settings().DATABASE
        topic = self.topic(task.queue_name)
        # One transaction (a savepoint inside the caller's): the message and its result
        # row exist together, and only if the caller's transaction commits.
        with transaction.atomic(using=alias):
            sent = send_message(
                topic, envelope.payload(), id=result.id, partition_key=_partition_key.get(),
                priority=message_priority(task.priority), deliver_at=_aware(task.run_after),
                metadata={**(_metadata.get() or {}), "task": task.module_path,
                          "backend": self.alias},
                using=alias,
            )
            TaskRecord.objects.using(alias).create(
                id=result.id, backend=self.alias, task_path=task.module_path,
                queue_name=task.queue_name, priority=task.priority,
                run_after=_stored(task.run_after), topic=topic,
                partition_key=sent.partition_key, message_offset=sent.offset,
                status=Status.READY, args=envelope.args, kwargs=envelope.kwargs,
                enqueued_at=now, updated_at=now,
            )
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results --------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        # Imported here: the models need sqlqueue in INSTALLED_APPS, and this module must
        # import without it so that check sqlqueue.E201 can say so.
        from sqlqueue.integrations.tasks.results import read_result

        return read_result(self.alias, self.sqlqueue_options.group, result_id)

    # -- checks ---------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[CheckMessage]:
        if apps.is_installed("sqlqueue"):
            return []
        return [CheckError(
            f"TASKS[{self.alias!r}] uses sqlqueue.tasks.SQLQueueBackend, but sqlqueue is "
            "not in INSTALLED_APPS.",
            hint="Add 'sqlqueue' to INSTALLED_APPS and run migrate.",
            id="sqlqueue.E201",
        )]


def _aware(moment: datetime | None) -> datetime | None:
    """sqlqueue schedules by aware datetimes; with USE_TZ = False Django allows naive
    ones, which mean the current time zone."""
    if moment is None or timezone.is_aware(moment):
        return moment
    return timezone.make_aware(moment)


def _stored(moment: datetime | None) -> datetime | None:
    """What a DateTimeField accepts under the project's USE_TZ."""
    if moment is None or settings.USE_TZ or timezone.is_naive(moment):
        return moment
    return timezone.make_naive(moment)


__all__ = ["SQLQueueBackend", "partition_key"]
