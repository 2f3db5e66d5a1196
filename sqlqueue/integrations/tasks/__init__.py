"""sqlqueue as a backend of Django's Tasks framework (docs/guides/tasks.md).

    TASKS = {"default": {"BACKEND": "sqlqueue.tasks.SQLQueueBackend"}}

Layout: ``options`` (the backend's OPTIONS and the queue -> topic and priority mappings,
pure Python), ``envelope`` (the message payload of a task), ``models`` (the results
table), ``backend`` (enqueue and get_result), ``worker`` (the consumer handler that runs
a task), ``registration`` (one consumer per queue, at start-up), ``retention`` (collecting
old results). Only ``backend``, ``worker`` and ``results`` import the Tasks framework, so
the rest loads on a Django without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SQLQueueBackend"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (its models are part of sqlqueue's) must not need
    # django.tasks, which Django 5.2 lacks.
    if name == "SQLQueueBackend":
        from sqlqueue.integrations.tasks.backend import SQLQueueBackend

        return SQLQueueBackend
    raise AttributeError(name)
