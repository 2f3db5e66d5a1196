"""System checks. Ids are stable and documented in docs/reference/checks.md.

Settings checks (``sqlqueue.E001``-``E009``, ``W001``-``W004``, ``E202`` for ``TASKS``
entries, ``E301``-``E309`` for schedules) run with every ``manage.py check``. Database
checks (``E101``-``E106``, ``W101``-``W107``, ``W110``) need a connection, so Django runs
them only with ``check --database`` and before ``migrate``.

Each check id is made by one function, in the module of what it checks: ``settings``
(the ``SQLQUEUE`` and ``TASKS`` settings, installed apps and packages), ``database``
(which databases are checked, and what is reported when one cannot be), the vendors'
``mysql``, ``postgresql`` and ``sqlite``, ``poolers`` (PostgreSQL behind a connection
pooler) and ``versions`` (the oldest server each vendor takes). They are registered with
Django here, and only here.
"""

from __future__ import annotations

from django.core.checks import Tags, register

from sqlqueue.checks.database import check_database
from sqlqueue.checks.settings import (
    check_admin_apps,
    check_schedules,
    check_settings,
    check_task_backends,
    check_wakeup_channels,
)

__all__ = ["check_admin_apps", "check_database", "check_schedules", "check_settings",
           "check_task_backends", "check_wakeup_channels"]

register("sqlqueue")(check_settings)
register("sqlqueue", Tags.admin)(check_admin_apps)
register("sqlqueue")(check_wakeup_channels)
register("sqlqueue")(check_task_backends)
register("sqlqueue")(check_schedules)
register(Tags.database)(check_database)
