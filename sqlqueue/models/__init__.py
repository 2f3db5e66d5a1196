"""Django models mirroring the five tables of the RFC "SQL-Based Distributed Queue", and
sqlqueue's own (``queue_task_results`` is the Tasks backend's).

Table and column names, keys and units are the RFC's (timestamps are epoch milliseconds
in BIGINT UNSIGNED). Columns the RFC lacks carry a database default, so a row written by
another RFC implementation, with only the RFC's columns, is valid and consumed normally.
docs/reference/schema.md has the final DDL and the reasons behind each choice.

The four per-group tables use Django's ``CompositePrimaryKey`` so the primary keys are
exactly the RFC's: the hot-path upserts (``INSERT ... ON DUPLICATE KEY UPDATE``) conflict
on them, and no surrogate column widens the rows or their secondary indexes.

Each module holds one concern: ``fields`` (the column types they share), ``log`` (the
messages, dead letters, idempotency keys), ``groups`` (each group's delivery state,
leases, watermarks, heartbeats), ``control`` (pauses, runner requests), ``collections``
(the runs of ``queue gc``), ``schedules``, ``stats`` (the live overview's per-minute
rollup) and ``pages`` (the admin pages without a table of their own). Every model is
imported here, where Django looks for the app's models.
"""

from __future__ import annotations

# The results table of the Django Tasks backend (sqlqueue.integrations.tasks), defined
# next to the backend it serves; imported here so that it belongs to this app.
from sqlqueue.integrations.tasks.models import TaskRecord
from sqlqueue.models.collections import CollectionRun
from sqlqueue.models.control import FlowControl, RunnerAction, RunnerRequest, RunnerStopCause
from sqlqueue.models.fields import UnsignedBigAutoField
from sqlqueue.models.groups import (
    DeliveryState,
    PartitionLease,
    PartitionOffset,
    SubscriberHeartbeat,
)
from sqlqueue.models.log import (
    IS_DEAD_LETTER,
    DeadLetter,
    DeadLetterManager,
    IdempotencyKey,
    QueueMessage,
)
from sqlqueue.models.pages import ConsumerLag, LiveOverview, SubscriberStatus
from sqlqueue.models.schedules import ScheduleState, StoredSchedule
from sqlqueue.models.stats import MinuteStats

__all__ = [
    "IS_DEAD_LETTER",
    "CollectionRun",
    "ConsumerLag",
    "DeadLetter",
    "DeadLetterManager",
    "DeliveryState",
    "FlowControl",
    "IdempotencyKey",
    "LiveOverview",
    "MinuteStats",
    "PartitionLease",
    "PartitionOffset",
    "QueueMessage",
    "RunnerAction",
    "RunnerRequest",
    "RunnerStopCause",
    "ScheduleState",
    "StoredSchedule",
    "SubscriberHeartbeat",
    "SubscriberStatus",
    "TaskRecord",
    "UnsignedBigAutoField",
]
