"""Deleting old task results (``OPTIONS["RESULT_RETENTION"]``, default 7 days).

The garbage collector of ``runconsumer`` (and ``manage.py queue gc``) calls
``collect_results()``: each backend's rows untouched for longer than its retention go, in
batches, if they finished or were attempted and abandoned (``TaskRecord.collectable``).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from sqlqueue.integrations.tasks.models import TaskRecord

#: TASKS alias -> seconds its results are kept; filled in at start-up by registration
_retention: dict[str, float] = {}


def configure(alias: str, seconds: float) -> None:
    _retention[alias] = seconds


def collect_results(database: str, batch: int) -> tuple[int, bool]:
    """Delete up to ``batch`` expired results per backend; returns (rows deleted, whether
    some backend had a full batch, so more may be left)."""
    deleted, more = 0, False
    now = timezone.now()
    for alias, seconds in sorted(_retention.items()):
        expired = (TaskRecord.objects.using(database).of_backend(alias)
                   .collectable(now - timedelta(seconds=seconds)))
        ids = list(expired.order_by("updated_at").values_list("pk", flat=True)[:batch])
        if ids:
            deleted += TaskRecord.objects.using(database).filter(pk__in=ids).delete()[0]
        more = more or len(ids) == batch
    return deleted, more
