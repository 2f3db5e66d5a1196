"""The Django Tasks backend, at the path the ``TASKS`` setting names::

    TASKS = {"default": {"BACKEND": "sqlqueue.tasks.SQLQueueBackend"}}

Importing this module needs Django's Tasks framework (Django 6.0+, or the
``django-tasks`` backport on Django 5.2). See docs/guides/tasks.md.
"""

from __future__ import annotations

from sqlqueue.integrations.tasks.backend import SQLQueueBackend, partition_key

__all__ = ["SQLQueueBackend", "partition_key"]
