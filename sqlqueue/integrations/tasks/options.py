"""The backend's ``OPTIONS``, and how Django's task terms map onto sqlqueue's.

Pure Python, no Tasks framework import: the registration at start-up and the garbage
collector read these too.

* A queue name becomes the topic ``TOPIC_PREFIX + queue_name`` (``tasks.default``).
* Every queue is consumed by the consumer group ``GROUP`` (``tasks``).
* Django's priority, -100..100 with higher first, becomes sqlqueue's 0..200 with lower
  first (``100 - priority``): strictly monotonic, so two tasks of different priorities
  never tie; Django's default 0 is sqlqueue's 100.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlqueue.consuming.registry import OPTION_SETTINGS
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.naming import check_name
from sqlqueue.setting_converters import CONVERTERS, BadValue

DEFAULT_GROUP = "tasks"
DEFAULT_TOPIC_PREFIX = "tasks."
DEFAULT_RESULT_RETENTION = timedelta(days=7).total_seconds()
PRIORITY_OFFSET = 100  # sqlqueue priority = PRIORITY_OFFSET - Django priority

#: OPTIONS key -> the @consumer option it sets (default: the SQLQUEUE key of that name)
CONSUMER_OPTIONS = {key: option for option, key in OPTION_SETTINGS.items()}
KNOWN_OPTIONS = (
    "GROUP", "TOPIC_PREFIX", "ORDERED", "ATOMIC", "RESULT_RETENTION", *CONSUMER_OPTIONS,
)


@dataclass(frozen=True)
class TaskOptions:
    """A backend's validated OPTIONS."""

    group: str = DEFAULT_GROUP
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    ordered: bool = False
    atomic: bool = False
    result_retention: float = DEFAULT_RESULT_RETENTION  # seconds
    #: @consumer options given in OPTIONS (max_attempts, ...); the rest follow SQLQUEUE
    consumer_overrides: tuple[tuple[str, Any], ...] = ()

    def topic(self, queue_name: str) -> str:
        return self.topic_prefix + queue_name

    @property
    def max_attempts(self) -> int | None:
        return dict(self.consumer_overrides).get("max_attempts")


def parse_options(alias: str, raw: Any) -> TaskOptions:
    """Validate ``TASKS[alias]["OPTIONS"]``; a ``ConfigurationError`` names every problem."""
    if raw is None:
        raw = {}
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a dict, not {type(raw).__name__}.")
    problems = [
        f"unknown key {key!r} (known: {', '.join(KNOWN_OPTIONS)})"
        for key in sorted(set(raw) - set(KNOWN_OPTIONS), key=str)
    ]
    values: dict[str, Any] = {}
    for key, convert in _CONVERTERS.items():
        if key not in raw:
            continue
        try:
            values[key] = convert(raw[key])
        except BadValue as bad:
            problems.append(f"{key!r} {bad.reason}; got {raw[key]!r}")
        except ValueError as bad:  # a group or prefix that is no valid name
            problems.append(str(bad).rstrip("."))
    if problems:
        raise ConfigurationError(f"{where}: {'; '.join(problems)}.")
    overrides = tuple(
        (CONSUMER_OPTIONS[key], values[key]) for key in CONSUMER_OPTIONS if key in values
    )
    return TaskOptions(
        group=values.get("GROUP", DEFAULT_GROUP),
        topic_prefix=values.get("TOPIC_PREFIX", DEFAULT_TOPIC_PREFIX),
        ordered=values.get("ORDERED", False),
        atomic=values.get("ATOMIC", False),
        result_retention=values.get("RESULT_RETENTION", DEFAULT_RESULT_RETENTION),
        consumer_overrides=overrides,
    )


def message_priority(task_priority: int) -> int:
    """Django's -100..100 (higher first) as sqlqueue's 0..200 (lower first)."""
    return PRIORITY_OFFSET - int(task_priority)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadValue("", "must be True or False")
    return value


def _group(value: Any) -> str:
    return check_name("GROUP", value)


def _prefix(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue("", "must be a string")
    if value:
        check_name("TOPIC_PREFIX", value, max_bytes=128)
    return value


_CONVERTERS = {
    "GROUP": _group,
    "TOPIC_PREFIX": _prefix,
    "ORDERED": _flag,
    "ATOMIC": _flag,
    "RESULT_RETENTION": CONVERTERS["VISIBILITY_TIMEOUT"],  # a positive duration
    **{key: CONVERTERS[key] for key in CONSUMER_OPTIONS},
}
