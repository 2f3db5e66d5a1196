"""Pauses: pause and resume consumer groups (docs/guides/operations.md, "Pause and resume";
the module keeps the name ``flow`` its documented import path has).

A pause is a row of ``queue_flow_control`` naming a group and a topic, or every group of
a topic (``group=None``), or every topic of a group (``topic=None``). Every running
subscriber reads the pauses once a second: a paused one starts no new handler, lets the
running ones finish and records their outcomes, gives back what it had queued, and keeps
its leases and heartbeat (so the lag pages show PAUSED, not STOP or STALL). Resuming
deletes the row; work restarts within a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections, transaction

from sqlqueue import storage
from sqlqueue.conf import MAX_NAME_BYTES, get_settings
from sqlqueue.consuming.pauses import matches
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import FlowControl


class InvalidPause(SqlqueueError, ValueError):
    """A pause or resume that names nothing, or a name that cannot be stored."""


@dataclass(frozen=True)
class PauseRow:
    group: str  # "" = every group of the topic
    topic: str  # "" = every topic of the group
    paused_at_ms: int
    paused_by: str

    def describe(self) -> str:
        group = f"group {self.group}" if self.group else "every group"
        topic = f"topic {self.topic}" if self.topic else "every topic"
        return f"{group} on {topic}"


def _scope(group: str | None, topic: str | None) -> tuple[str, str]:
    if not group and not topic:
        raise InvalidPause("Name a group, a topic, or both: pausing everything at once is "
                           "not supported.")
    for label, value in (("group", group), ("topic", topic)):
        if value is not None and (len(value.encode("utf-8")) > MAX_NAME_BYTES
                                  or any(ord(c) < 32 for c in value)):
            raise InvalidPause(f"Invalid {label} name {value!r}: at most {MAX_NAME_BYTES} "
                               "bytes, no control characters.")
    return group or "", topic or ""


def pause(group: str | None = None, topic: str | None = None, *, by: str = "",
          using: str | None = None) -> bool:
    """Pause ``group`` on ``topic`` (None: every group of the topic, or every topic of
    the group). Returns False if that exact pause already existed."""
    key = _scope(group, topic)
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        now = storage.store(connection).database_now_ms(cursor)
        _, created = FlowControl.objects.using(alias).get_or_create(
            consumer_group=key[0], topic=key[1],
            defaults={"paused_at": now, "paused_by": by[:255]})
    return created


def resume(group: str | None = None, topic: str | None = None, *,
           using: str | None = None) -> bool:
    """Remove the pause that names exactly ``group`` and ``topic`` (as given to
    ``pause``). Returns False if there was none. Another pause that still covers the
    subscription (say, of the whole topic) keeps it paused: see ``paused()``."""
    key = _scope(group, topic)
    alias = using or get_settings().DATABASE
    deleted, _ = FlowControl.objects.using(alias).filter(
        consumer_group=key[0], topic=key[1]).delete()
    return bool(deleted)


def pauses(using: str | None = None) -> list[PauseRow]:
    """Every pause, oldest first."""
    alias = using or get_settings().DATABASE
    return [PauseRow(g, t, at, by) for g, t, at, by in
            FlowControl.objects.using(alias).order_by("paused_at", "consumer_group", "topic")
            .values_list("consumer_group", "topic", "paused_at", "paused_by")]


def is_paused(group: str, topic: str, using: str | None = None,
              rows: list[PauseRow] | None = None) -> bool:
    """Whether a pause covers ``group`` on ``topic`` (``rows``: pauses already read)."""
    rows = pauses(using) if rows is None else rows
    return matches(((p.group, p.topic) for p in rows), group, topic)
