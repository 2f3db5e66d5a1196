"""What several verbs of ``manage.py queue`` share: the output they write to (made
inert), and the checks of a database alias and of a (group, topic) pair given on the
command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO, cast

from django.core.management.base import CommandError, OutputWrapper
from django.db import connections

from sqlqueue.conf import get_settings
from sqlqueue.naming import escape_controls
from sqlqueue.operations.lag import known_subscriptions

#: a verb: writes to the command's output, from the command's parsed options
Verb = Callable[[OutputWrapper, dict[str, Any]], None]


class InertOutput(OutputWrapper):
    """A command's output with everything it prints made inert (SECURITY.md): control
    and invisible characters (escape sequences, bidirectional overrides, zero-width
    characters) escaped in each line, whichever field they came from; the line breaks a
    command writes itself are kept. Text a verb escaped already is left as it is."""

    def __init__(self, wrapped: OutputWrapper) -> None:
        super().__init__(cast(TextIO, wrapped._out), wrapped.ending)
        self._style_func = wrapped._style_func

    def write(  # type: ignore[override]  # as OutputWrapper's own
        self, msg: str = "", style_func: Callable[[str], str] | None = None,
        ending: str | None = None,
    ) -> None:
        super().write(inert(msg), style_func, ending)


def inert(text: str) -> str:
    """``text`` with each line's control and invisible characters escaped."""
    return "\n".join(escape_controls(line) for line in text.split("\n"))


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
