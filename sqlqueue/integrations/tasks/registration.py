"""At start-up: one consumer per queue of every ``SQLQueueBackend`` in ``TASKS``.

Called from sqlqueue's ``AppConfig.ready()``, so ``manage.py runconsumer`` runs tasks
like any other consumer (``--group tasks`` runs only them) and the operator commands
and the admin see their groups and dead letters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.utils.module_loading import import_string

from sqlqueue.consuming.registry import consumer
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.integrations.tasks import retention

if TYPE_CHECKING:
    from sqlqueue.integrations.tasks.backend import SQLQueueBackend

BACKEND_CLASS = "SQLQueueBackend"
BACKEND_MODULE = "sqlqueue.integrations.tasks.backend"


#: TASKS alias -> why its consumers could not be registered at start-up (check E202)
_registration_problems: dict[str, str] = {}


def register_task_consumers() -> None:
    """Register every usable sqlqueue backend's consumers. Runs in ``AppConfig.ready()``:
    a bad entry is recorded for ``manage.py check`` (sqlqueue.E202), never raised, so
    that it cannot turn every manage.py command into a start-up traceback."""
    _registration_problems.clear()
    for alias, params in configured_backends():
        try:
            if not is_sqlqueue_backend(params.get("BACKEND")):
                continue
            from sqlqueue.integrations.tasks.compat import task_backends

            backend = cast("SQLQueueBackend", task_backends[alias])
            if backend.configuration_error is None:  # else the check reports it
                register_backend(backend)
        except ConfigurationError as exc:  # its messages name TASKS[alias] already
            _registration_problems[alias] = str(exc)
        except ImportError as exc:
            _registration_problems[alias] = _unimportable(alias, exc)


def task_backend_problems() -> list[tuple[str, str]]:
    """(alias, problem) for every sqlqueue backend in TASKS that cannot run its tasks.

    Built afresh on each call (not from Django's cached backends), so that it follows
    ``override_settings``; plus what went wrong registering consumers at start-up."""
    problems: list[tuple[str, str]] = []
    for alias, params in configured_backends():
        try:
            if not is_sqlqueue_backend(params.get("BACKEND")):
                continue
            backend = import_string(params["BACKEND"])(alias=alias, params=params)
        except ImportError as exc:
            problems.append((alias, _unimportable(alias, exc)))
            continue
        if backend.configuration_error is not None:
            problems.append((alias, backend.configuration_error))
        elif alias in _registration_problems:
            problems.append((alias, _registration_problems[alias]))
    return problems


def _unimportable(alias: str, exc: ImportError) -> str:
    return f"TASKS[{alias!r}]['BACKEND'] cannot be imported: {exc}"


def configured_backends() -> list[tuple[str, dict[str, Any]]]:
    from django.conf import settings

    configured: Any = getattr(settings, "TASKS", None) or {}
    if not isinstance(configured, dict):
        return []  # Django's own checks report a TASKS that is not a dict
    return [(alias, params) for alias, params in configured.items()
            if isinstance(params, dict)]


def is_sqlqueue_backend(path: Any) -> bool:
    """Whether ``path`` names ``SQLQueueBackend`` or a subclass of it. Other backends'
    import errors are theirs to report; a broken path of ours is an error now."""
    if not isinstance(path, str):
        return False
    try:
        backend_class = import_string(path)
    except ImportError:
        if path.startswith("sqlqueue."):
            raise
        return False
    return any(c.__module__ == BACKEND_MODULE and c.__name__ == BACKEND_CLASS
               for c in getattr(backend_class, "__mro__", ()))


def register_backend(backend: SQLQueueBackend) -> None:
    from sqlqueue.integrations.tasks.worker import TaskWorker

    options = backend.sqlqueue_options
    worker = TaskWorker(backend.alias, options)
    for queue_name in sorted(backend.queues):
        topic = options.topic(queue_name)
        try:
            consumer(topic, group=options.group, ordered=options.ordered,
                     **dict(options.consumer_overrides))(worker)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"TASKS[{backend.alias!r}]: queue {queue_name!r} maps to topic {topic!r}, "
                f"which group {options.group!r} already consumes ({exc}). Give this backend "
                "another OPTIONS['TOPIC_PREFIX'] or OPTIONS['GROUP']."
            ) from exc
    retention.configure(backend.alias, options.result_retention)
