"""``queue_task_results``: one row per task enqueued through ``SQLQueueBackend``.

The message in ``queue_messages`` is what a worker runs; this row is what
``get_result()`` reads. It is written in the enqueuing transaction (so a rolled-back
enqueue leaves neither), moved to RUNNING when a worker starts an attempt, and to
SUCCESSFUL in the same transaction as the message's ack (and, with ``ATOMIC``, as the
task's own writes). It keeps a copy of the arguments, so that a result outlives the
message log's garbage collection, and is deleted ``RESULT_RETENTION`` after its last
change (docs/guides/tasks.md, "Results and retention").

No import of the Tasks framework here: sqlqueue's models load on every Django version.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from sqlqueue.conf import MAX_NAME_BYTES
from sqlqueue.naming import storable_text

#: Errors kept per result (the newest): a task retried a thousand times stays one row.
MAX_KEPT_ERRORS = 25
#: Characters of a traceback kept per error (its start and its end).
MAX_TRACEBACK_CHARS = 16 * 1024


class Status(models.TextChoices):
    """The values of Django's ``TaskResultStatus``."""

    READY = "READY", "Ready"
    RUNNING = "RUNNING", "Running"
    FAILED = "FAILED", "Failed"
    SUCCESSFUL = "SUCCESSFUL", "Successful"


FINISHED = (Status.SUCCESSFUL, Status.FAILED)


class TaskRecordQuerySet(models.QuerySet["TaskRecord"]):
    def of_backend(self, alias: str) -> TaskRecordQuerySet:
        return self.filter(backend=alias)

    def collectable(self, cutoff: datetime) -> TaskRecordQuerySet:
        """Untouched since ``cutoff`` and either finished, or attempted and abandoned (a
        task whose dead letter was discarded). Never-attempted rows stay: a task may be
        scheduled far ahead, or wait for a worker that is not running yet."""
        return self.filter(updated_at__lt=cutoff).filter(
            models.Q(status__in=FINISHED) | models.Q(last_attempted_at__isnull=False)
        )


def truncated(traceback: str) -> str:
    """The traceback to keep: capped, and made safe for jsonb (no NUL, no lone
    surrogate: guarantee I15)."""
    if len(traceback) > MAX_TRACEBACK_CHARS:
        half = MAX_TRACEBACK_CHARS // 2
        traceback = traceback[:half] + "\n[... traceback truncated ...]\n" + traceback[-half:]
    return storable_text(traceback)


class TaskRecord(models.Model):
    """A task's result as Django's ``TaskResult`` describes it, plus where its message is."""

    id = models.CharField(primary_key=True, max_length=MAX_NAME_BYTES,
                          help_text="The TaskResult id, and the id of the task's message.")
    backend = models.CharField(max_length=MAX_NAME_BYTES, help_text="TASKS alias.")
    task_path = models.CharField(max_length=MAX_NAME_BYTES)
    queue_name = models.CharField(max_length=MAX_NAME_BYTES)
    priority = models.SmallIntegerField(default=0, help_text="Django's -100..100.")
    run_after = models.DateTimeField(null=True, blank=True)
    topic = models.CharField(max_length=MAX_NAME_BYTES)
    partition_key = models.CharField(max_length=MAX_NAME_BYTES)
    message_offset = models.PositiveBigIntegerField(
        help_text="Offset of the message the latest attempt ran (a replay has a new one).")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.READY)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list, help_text=(
        f"[{{exception_class_path, traceback}}], the newest {MAX_KEPT_ERRORS}."))
    worker_ids = models.JSONField(default=list, help_text="One entry per attempt.")
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(help_text="Last change; retention counts from here.")

    objects = TaskRecordQuerySet.as_manager()

    class Meta:
        db_table = "queue_task_results"
        indexes = [models.Index(fields=["backend", "updated_at"], name="idx_task_backend_updated")]
        verbose_name = "task result"

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    # -- state changes, each saving only what it changes ------------------------------
    def begin_attempt(self, worker_id: str, message_offset: int, now: datetime) -> None:
        self.status = Status.RUNNING
        self.started_at = self.started_at or now
        self.last_attempted_at = now
        self.finished_at = None
        self.worker_ids = [*self.worker_ids, worker_id]
        self.message_offset = message_offset
        self._save(now, "status", "started_at", "last_attempted_at", "finished_at",
                   "worker_ids", "message_offset")

    def succeed(self, return_value: Any, now: datetime) -> None:
        self.status = Status.SUCCESSFUL
        self.return_value = return_value
        self.finished_at = now
        self._save(now, "status", "return_value", "finished_at")

    def fail(self, exception_class_path: str, traceback: str, *, final: bool,
             now: datetime) -> None:
        """Record a failed attempt: READY again while attempts remain, else FAILED."""
        error = {"exception_class_path": exception_class_path, "traceback": truncated(traceback)}
        self.errors = [*self.errors, error][-MAX_KEPT_ERRORS:]
        self.status = Status.FAILED if final else Status.READY
        self.finished_at = now if final else None
        self._save(now, "errors", "status", "finished_at")

    def wait_for_retry(self, now: datetime) -> None:
        """The task asked for a retry (``sqlqueue.Retry``): not an error, READY again."""
        self.status = Status.READY
        self._save(now, "status")

    def _save(self, now: datetime, *fields: str) -> None:
        self.updated_at = now
        self.save(update_fields=[*fields, "updated_at"])
