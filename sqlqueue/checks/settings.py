"""The checks of the settings, the installed apps and the installed packages: no database
needed, so they run with every ``manage.py check``. One function per check id (or per
family of ids another module already tells apart: ``conf.validate`` for
``sqlqueue.E001``-``E009``, ``W001`` and ``W002``, ``scheduling.validation`` for
``E301``-``E309``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from sqlqueue.conf import validate


def _message(problem_id: str, msg: str, hint: str | None = None) -> CheckMessage:
    kind = Error if ".E" in problem_id else Warning
    return kind(msg, hint=hint, id=problem_id)


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``SQLQUEUE`` itself (sqlqueue.E001-E009, W001, W002): what ``conf.validate`` finds,
    the same problems the runtime refuses the settings for."""
    _, problems = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    return [_message(p.id, p.msg, p.hint) for p in problems]


def check_admin_apps(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """sqlqueue.W003: sqlqueue's admin pages filter by date with django-admin-rangefilter,
    whose templates Django finds only when ``"rangefilter"`` is an installed app."""
    if not apps.is_installed("django.contrib.admin") or apps.is_installed("rangefilter"):
        return []
    return [Warning(
        "'rangefilter' is not in INSTALLED_APPS: the sqlqueue admin's Messages and Dead "
        "letters pages are shown without their date-range filters.",
        hint="Add 'rangefilter' (django-admin-rangefilter, installed with sqlqueue) to "
             "INSTALLED_APPS.",
        id="sqlqueue.W003",
    )]


def check_wakeup_channels(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """sqlqueue.W004: a Redis wake-up channel needs the ``redis`` package (the ``redis``
    extra)."""
    conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    if conf is None or not conf.WAKEUP_REDIS_URL or importlib.util.find_spec("redis"):
        return []
    return [Warning(
        "SQLQUEUE['WAKEUP_REDIS_URL'] is set but the 'redis' package is not installed: "
        "runners wake up by polling only.",
        hint='pip install "django-sqlqueue[redis]", or remove WAKEUP_REDIS_URL.',
        id="sqlqueue.W004",
    )]


def check_task_backends(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """sqlqueue.E202: bad ``TASKS`` entries of ours, reported here rather than raised at
    start-up."""
    from sqlqueue.integrations.tasks.registration import task_backend_problems

    return [Error(
        problem,
        hint="Fix this TASKS entry (docs/guides/tasks.md); its tasks cannot be enqueued "
             "or run until then.",
        id="sqlqueue.E202",
    ) for _, problem in task_backend_problems()]


def check_schedules(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every unusable entry of ``SQLQUEUE["SCHEDULES"]`` (sqlqueue.E301-E309)."""
    from sqlqueue.scheduling.validation import schedule_errors

    conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    if conf is None:
        return []  # check_settings reports why
    return [Error(str(error), hint="docs/guides/schedules.md lists what a schedule takes.",
                  id=error.check_id) for error in schedule_errors(conf)]
