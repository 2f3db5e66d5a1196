"""Django's Tasks framework: ``django.tasks`` on Django 6.0+, the ``django-tasks`` backport
(same API, module ``django_tasks``) on Django 5.2."""

from __future__ import annotations

from typing import TYPE_CHECKING

import django

if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import (
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # pragma: no cover - exercised by tox's Django 5.2 environments
    try:
        from django_tasks import task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImportError(
            "sqlqueue.tasks.SQLQueueBackend needs Django's Tasks framework: Django 6.0 or "
            "later, or on Django 5.2 the backport (pip install django-tasks)."
        ) from exc

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
