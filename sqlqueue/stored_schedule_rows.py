"""A stored schedule's row of ticks goes with it (issue 53, F14).

A schedule's ``queue_schedules`` row is keyed by its name only. A stored schedule
deleted and created again under the same name went on from the old row: the ticks
between were "missed" (skipped with a warning, or published by ``catch_up``), whereas
a schedule seen for the first time starts from that moment (docs/guides/schedules.md).
So the row is deleted when its stored schedule is deleted, in the delete's transaction,
and again when one is created (a runner that had not yet seen the deletion, up to one
reload later, may have written it back). Signals, so that every way counts: the admin,
``save_stored_schedule`` and the ORM (one row or a queryset)."""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.db.models.signals import post_delete, post_save

from sqlqueue import storage
from sqlqueue.conf import get_settings
from sqlqueue.models import StoredSchedule


def forget_tick_state(stored: StoredSchedule, using: str) -> None:
    """Delete ``stored``'s ``queue_schedules`` row on ``using`` (the stored schedule's
    database: inside the caller's transaction) and, if ``ROUTES`` sends its topic
    elsewhere, on that database too (in a transaction of its own)."""
    for alias in dict.fromkeys((using, _ticks_alias(stored, using))):
        connection = connections[alias]
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            storage.store(connection).delete_schedule(cursor, stored.name)


def _ticks_alias(stored: StoredSchedule, using: str) -> str:
    """Where the ticker keeps the row (``sqlqueue.scheduling.ticker.alias_for``, which
    this layer may not import): a message schedule's topic's database, else ``using``."""
    topic = stored.entry.get("topic") if isinstance(stored.entry, dict) else None
    return get_settings().alias_for(topic) if isinstance(topic, str) and topic else using


def _deleted(sender: Any, instance: StoredSchedule, using: str, **kwargs: Any) -> None:
    forget_tick_state(instance, using)


def _saved(sender: Any, instance: StoredSchedule, created: bool, using: str,
           **kwargs: Any) -> None:
    if created:
        forget_tick_state(instance, using)


def connect() -> None:
    """Called once by ``SqlqueueConfig.ready``."""
    post_delete.connect(_deleted, sender=StoredSchedule,
                        dispatch_uid="sqlqueue.stored_schedule_rows.deleted")
    post_save.connect(_saved, sender=StoredSchedule,
                      dispatch_uid="sqlqueue.stored_schedule_rows.created")
