"""``queue pause``, ``queue resume`` and ``queue pauses``: the pauses of groups and topics
(sqlqueue.operations.flow)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from sqlqueue.conf import get_settings
from sqlqueue.management.queue_verbs.common import alias_of, require_known
from sqlqueue.operations import flow
from sqlqueue.operations.lag import known_subscriptions


def list_pauses(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``pauses``: every pause in force, in every database the queue lives in."""
    rows = [row for alias in get_settings().databases for row in flow.pauses(alias)]
    for row in rows:
        out.write(f"Paused: {row.describe()} (by {row.paused_by or '-'}).")
    if not rows:
        out.write("Nothing is paused.")


def pause_or_resume(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``pause`` or ``resume`` (``options["verb"]``) a group, a topic, or both."""
    verb = options["verb"]
    databases = get_settings().databases
    group, topic = options["group"], options["topic"]
    _require_subscribed(group, topic, databases)
    # A topic's pause lives where the topic does; a whole group's, everywhere.
    targets = [alias_of(topic)] if topic else list(databases)
    try:
        # Every database is written (no short cut once one changed).
        if verb == "pause":
            changes = [flow.pause(group, topic, by="manage.py queue pause", using=alias)
                       for alias in targets]
        else:
            changes = [flow.resume(group, topic, using=alias) for alias in targets]
        changed = any(changes)
    except flow.InvalidPause as error:
        raise CommandError(str(error)) from None
    what = flow.PauseRow(group or "", topic or "", 0, "").describe()
    if verb == "pause":
        out.write(f"Paused {what}: running consumers start nothing new within "
                  "about a second." if changed else f"{what} was already paused.")
    elif changed:
        out.write(f"Resumed {what}.")
    else:
        raise CommandError(f"No pause of {what} (see `manage.py queue pauses`).")
    if verb == "resume" and (group and topic) and flow.is_paused(
            group, topic, using=alias_of(topic)):
        out.write(f"Note: {group} on {topic} is still paused by a broader pause.")


def _require_subscribed(group: str | None, topic: str | None,
                        databases: tuple[str, ...]) -> None:
    """A ``CommandError`` unless the group, the topic, or the pair has registered."""
    known = {pair for alias in databases for pair in known_subscriptions(alias)}
    if group and topic:
        require_known(group, topic)
    elif group and group not in {g for g, _ in known}:
        raise CommandError(f"No consumer group {group!r} (see `manage.py queue status`).")
    elif topic and topic not in {t for _, t in known}:
        raise CommandError(f"No consumer group on topic {topic!r} (see "
                           "`manage.py queue status`).")
