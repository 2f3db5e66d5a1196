"""Running a task: the consumer handler of a backend's task topics.

One delivery of a task's message is one attempt:

1. a short transaction marks the result RUNNING (so ``get_result()`` shows it) and adds
   this worker to ``worker_ids``; a delivery of a task that already succeeded (its ack
   was lost in a crash) stops here and is acked;
2. the task runs: on its own, or with ``OPTIONS["ATOMIC"]`` inside
   ``transaction.atomic()`` on the queue's database;
3. on success, one transaction writes SUCCESSFUL with the return value and acks the
   message (with ``ATOMIC``, the same transaction as the task's own writes);
4. on an exception, the error is recorded (READY again while attempts remain, FAILED on
   the last) and re-raised, so that sqlqueue's backoff schedules the retry, or the
   message is dead-lettered for the group, whence the admin can replay it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from django.db import Error as AnyDatabaseError
from django.db import connections, transaction
from django.utils import timezone

from sqlqueue.conf import get_settings
from sqlqueue.consuming.message import Message, Reject, Retry
from sqlqueue.consuming.outcomes import ack
from sqlqueue.consuming.runner import default_name
from sqlqueue.integrations.tasks.compat import (
    Task,
    TaskContext,
    TaskResult,
    normalize_json,
    task_finished,
    task_started,
)
from sqlqueue.integrations.tasks.envelope import BadEnvelope, Envelope, open_envelope
from sqlqueue.integrations.tasks.models import Status, TaskRecord
from sqlqueue.integrations.tasks.options import TaskOptions
from sqlqueue.integrations.tasks.results import (
    TaskNotFound,
    declared_backend,
    task_of,
    to_task_result,
)
from sqlqueue.naming import has_unstorable_text

logger = logging.getLogger("sqlqueue.tasks")


class TaskWorker:
    """Runs the tasks of one ``SQLQueueBackend`` (every queue of it)."""

    def __init__(self, backend_alias: str, options: TaskOptions) -> None:
        self.backend_alias = backend_alias
        self.options = options
        # Named like a function, so that the consumer registry can tell handlers apart.
        self.__qualname__ = f"TaskWorker[{backend_alias}]"

    @property
    def database(self) -> str:
        return get_settings().DATABASE

    def max_attempts(self) -> int:
        return self.options.max_attempts or get_settings().MAX_ATTEMPTS

    def describe_message(self, message: Message) -> str | None:
        """The task a message runs, for sqlqueue's failure log lines (trial F17): "task
        app.tasks.send_invoice", or None for a message that is no task's."""
        try:
            return f"task {open_envelope(message.payload).task_path}"
        except BadEnvelope:
            return None

    def __call__(self, message: Message) -> None:
        try:
            envelope = open_envelope(message.payload)
        except BadEnvelope as exc:
            raise Reject(str(exc)) from exc  # no attempt can ever run it
        begun = self._begin(message, envelope)
        if begun is None:
            return  # finished by an earlier delivery whose ack was lost
        record, recreated = begun
        try:
            task = task_of(record)
        except TaskNotFound as exc:
            self._record_failure(record, exc, final=True)
            raise Reject(str(exc)) from exc
        wrong = self._wrong_backend(record, recreated)
        if wrong is not None:
            self._record_failure(record, wrong, final=True)
            raise Reject(str(wrong)) from wrong
        result = to_task_result(record, task)
        task_started.send(_sender(), task_result=result)
        try:
            self._run(task, result, record, message)
        except Exception as exc:
            final = isinstance(exc, Reject) or message.attempt >= self.max_attempts()
            if isinstance(exc, Retry) and not final:
                self._record_retry(record)
            else:
                self._record_failure(record, exc, final=final)
            if final:
                task_finished.send(_sender(), task_result=to_task_result(record, task))
            raise
        task_finished.send(_sender(), task_result=to_task_result(record, task))

    # -- the steps --------------------------------------------------------------------------
    def _begin(self, message: Message, envelope: Envelope) -> tuple[TaskRecord, bool] | None:
        """Mark the attempt RUNNING, in a transaction of its own so that it shows at once;
        with whether its row was written here (``_recreate``), not by ``enqueue``."""
        with transaction.atomic(using=self.database):
            record = (TaskRecord.objects.using(self.database).select_for_update()
                      .filter(pk=message.id).first())
            recreated = record is None
            if record is None:
                record = self._recreate(message, envelope)
            if record.status == Status.SUCCESSFUL:
                return None
            if record.status == Status.FAILED and record.message_offset == message.offset:
                # Failed for good, but the dead letter was not written (a crash between):
                # write it now. A replay has a new offset and runs again.
                raise Reject("the task already failed on its last attempt")
            record.begin_attempt(default_name(), message.offset, timezone.now())
        return record, recreated

    def _run(self, task: Task[Any, Any], result: TaskResult[Any, Any], record: TaskRecord,
             message: Message) -> None:
        if self.options.atomic:
            # The task's writes, its result and the ack commit together, or not at all.
            with transaction.atomic(using=self.database):
                value = _storable_result(_call(task, result))
                self._succeed(record, value, message)
            return
        value = _storable_result(_call(task, result))
        with transaction.atomic(using=self.database):
            self._succeed(record, value, message)

    def _succeed(self, record: TaskRecord, value: Any, message: Message) -> None:
        """SUCCESSFUL, and the message acked, in the caller's transaction."""
        record.succeed(value, timezone.now())
        ack(self.database, message.consumer_group, message.topic, message.partition_key,
            message.offset)

    def _record_failure(self, record: TaskRecord, exc: BaseException, *, final: bool) -> None:
        kind = type(exc)
        text = "".join(traceback.format_exception(exc))
        self._write(record, lambda: record.fail(f"{kind.__module__}.{kind.__qualname__}",
                                                text, final=final, now=timezone.now()))

    def _record_retry(self, record: TaskRecord) -> None:
        self._write(record, lambda: record.wait_for_retry(timezone.now()))

    def _write(self, record: TaskRecord, change: Callable[[], None]) -> None:
        """A result write after a failure must not hide the failure itself: if the
        database is what failed, the retry still happens and the next attempt writes."""
        try:
            change()
        except AnyDatabaseError as exc:  # InterfaceError too (a dropped connection)
            logger.warning("Could not record the outcome of task %s (%s).", record.id, exc)
            connections[self.database].close()

    def _wrong_backend(self, record: TaskRecord, recreated: bool) -> TaskNotFound | None:
        """Why this worker must not run ``task``, if it must not: a task runs only on the
        backend it was enqueued on and, for a message without a row ``enqueue`` wrote
        (published by other means; ``_recreate`` wrote its row), only if it was declared
        for this backend: a task of another backend published on this one's topics would
        run under options it was not written for (ATOMIC, ORDERED)."""
        if record.backend != self.backend_alias:
            return TaskNotFound(f"{record.task_path!r} was enqueued on backend "
                                f"{record.backend!r}, not on {self.backend_alias!r}, whose "
                                "worker received it.")
        declared = declared_backend(record.task_path)
        if recreated and declared != self.backend_alias:
            return TaskNotFound(f"{record.task_path!r} is a task of backend {declared!r}, "
                                f"not of {self.backend_alias!r}, on whose topic it was "
                                "published.")
        return None

    def _recreate(self, message: Message, envelope: Envelope) -> TaskRecord:
        """A task message without a result row (collected, or published by other means)."""
        prefix = self.options.topic_prefix
        queue_name = message.topic[len(prefix):] if message.topic.startswith(prefix) else (
            message.topic)
        return TaskRecord.objects.using(self.database).create(
            id=message.id, backend=self.backend_alias, task_path=envelope.task_path,
            queue_name=queue_name, topic=message.topic, partition_key=message.partition_key,
            message_offset=message.offset, args=envelope.args, kwargs=envelope.kwargs,
            enqueued_at=message.published_at, updated_at=timezone.now(),
        )


def _storable_result(value: Any) -> Any:
    """The task's return value as JSON to store; a ``ValueError`` (the attempt's failure,
    named) for text no database stores (a NUL, a lone surrogate: PostgreSQL's jsonb
    refused it with a bare DataError, and MariaDB stored it), on every database alike."""
    value = normalize_json(value)
    if any(has_unstorable_text(text) for text in _texts(value)):
        raise ValueError("The task's return value contains a NUL (U+0000) or a lone "
                         "surrogate, which cannot be stored as its result.")
    return value


def _texts(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included (with a stack: no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _call(task: Task[Any, Any], result: TaskResult[Any, Any]) -> Any:
    if task.takes_context:
        return task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
    return task.call(*result.args, **result.kwargs)


def _sender() -> type:
    from sqlqueue.integrations.tasks.backend import SQLQueueBackend

    return SQLQueueBackend
