"""Retrying and discarding failed tasks (the Task results page's actions, issue 42).

A task that failed for good is a dead letter of the backend's consumer group, and its
result row says FAILED. Retrying it replays that dead letter (the same result id runs
again, its earlier errors kept) and marks the result READY; discarding it deletes the
dead letter and the result, for good. Either happens in one transaction, with the
result row locked, so two operators clicking at once retry or discard a task once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from sqlqueue.conf import get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.integrations.tasks.models import Status, TaskRecord
from sqlqueue.models import DeadLetter
from sqlqueue.operations.dead_letters import discard_dead_letter, replay_dead_letter


class NotRetryable(SqlqueueError, LookupError):
    """The task has no dead letter to replay or discard: it did not fail, it was retried
    or discarded already, or its dead letter was discarded or collected."""


def dead_letter_of(record: TaskRecord, *, using: str | None = None) -> DeadLetter | None:
    """The dead letter of the message the task's latest attempt ran (its topic, partition
    and offset, which the dead letter's failure detail records), if it is still kept. A
    successful task has none; a task abandoned by a killed worker (still RUNNING) may."""
    if record.status == Status.SUCCESSFUL or record.message_offset is None:
        return None
    alias = using or record._state.db or get_settings().DATABASE
    return (DeadLetter.objects.using(alias)
            .filter(original_topic=record.topic, partition_key=record.partition_key,
                    failure_detail__offset=record.message_offset)
            .order_by("-offset").first())


def task_of_dead_letter(dead: DeadLetter, *, using: str | None = None) -> TaskRecord | None:
    """The task result whose message this dead letter is (a task's message id is its
    result id; a replayed one's failure detail still names the original's offset chain,
    so the result is found by its latest message's offset)."""
    detail = dead.failure_detail if isinstance(dead.failure_detail, dict) else {}
    offset = detail.get("offset")
    if not isinstance(offset, int):
        return None
    alias = using or dead._state.db or get_settings().DATABASE
    return TaskRecord.objects.using(alias).filter(
        topic=dead.original_topic, partition_key=dead.partition_key,
        message_offset=offset).first()


def retry_task(result_id: str, *, using: str | None = None) -> int:
    """Run a failed task again: replay its dead letter to the backend's group and mark the
    result READY. Returns the offset of the new message."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        record, dead = _locked_failed_task(result_id, alias)
        replayed = replay_dead_letter(dead.offset, using=alias)
        record.status = Status.READY
        record.finished_at = None
        record.updated_at = timezone.now()
        record.save(using=alias, update_fields=["status", "finished_at", "updated_at"])
    return replayed.offset


def discard_task(result_id: str, *, using: str | None = None) -> None:
    """Forget a failed task: delete its dead letter and its result, for good."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        record, dead = _locked_failed_task(result_id, alias)
        discard_dead_letter(dead.offset, using=alias)
        record.delete(using=alias)


@dataclass
class TasksResult:
    done: int = 0
    skipped: list[str] = field(default_factory=list)  # ids with no dead letter (any more)


def retry_tasks(result_ids: Iterable[str], *, using: str | None = None) -> TasksResult:
    """``retry_task`` for each id, one transaction each (a failure keeps what was done)."""
    return _each(result_ids, lambda result_id: retry_task(result_id, using=using))


def discard_tasks(result_ids: Iterable[str], *, using: str | None = None) -> TasksResult:
    """``discard_task`` for each id, one transaction each."""
    return _each(result_ids, lambda result_id: discard_task(result_id, using=using))


def _each(result_ids: Iterable[str], operation: Callable[[str], object]) -> TasksResult:
    result = TasksResult()
    for result_id in result_ids:
        try:
            operation(result_id)
            result.done += 1
        except NotRetryable:
            result.skipped.append(result_id)
    return result


def _locked_failed_task(result_id: str, alias: str) -> tuple[TaskRecord, DeadLetter]:
    record = (TaskRecord.objects.using(alias).select_for_update()
              .filter(pk=result_id).first())
    if record is None:
        raise NotRetryable(f"No task result {result_id!r}: it was discarded or collected.")
    dead = dead_letter_of(record, using=alias)
    if dead is None:
        raise NotRetryable(
            f"Task {result_id!r} ({record.status}) has no dead letter: it did not fail, it "
            "was retried or discarded already, or its dead letter was discarded.")
    return record, dead
