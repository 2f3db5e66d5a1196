"""What several verbs of ``manage.py queue`` share: the output they write to, and the
checks of a database alias and of a (group, topic) pair given on the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError, OutputWrapper
from django.db import connections

from sqlqueue.conf import get_settings
from sqlqueue.operations.lag import known_subscriptions

#: a verb: writes to the command's output, from the command's parsed options
Verb = Callable[[OutputWrapper, dict[str, Any]], None]


def alias_of(topic: str) -> str:
    """The database a topic's messages and state live in (``SQLQUEUE["ROUTES"]``)."""
    return get_settings().alias_for(topic)


def checked_alias(alias: str | None) -> str:
    """``--database``, checked (None: SQLQUEUE["DATABASE"])."""
    if alias is None:
        return get_settings().DATABASE
    if alias not in connections.settings:
        raise CommandError(f"--database {alias!r} is not a database alias in DATABASES "
                           f"({', '.join(sorted(connections.settings))}).")
    return alias


def require_known(group: str, topic: str) -> None:
    """A ``CommandError`` unless ``group`` has registered on ``topic``."""
    if (group, topic) not in known_subscriptions(alias_of(topic)):
        raise CommandError(f"No consumer group {group!r} on topic {topic!r} (see "
                           "`manage.py queue status`).")
