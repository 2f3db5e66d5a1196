"""Django models mirroring the five tables of the RFC "SQL-Based Distributed Queue", and
sqlqueue's own (``queue_task_results`` is the Tasks backend's, ``queue_minute_stats`` in
``sqlqueue.stats_models``).

Table and column names, keys and units are the RFC's (timestamps are epoch milliseconds
in BIGINT UNSIGNED). Columns the RFC lacks carry a database default, so a row written by
another RFC implementation, with only the RFC's columns, is valid and consumed normally.
docs/reference/schema.md has the final DDL and the reasons behind each choice.

The four per-group tables use Django's ``CompositePrimaryKey`` so the primary keys are
exactly the RFC's: the hot-path upserts (``INSERT ... ON DUPLICATE KEY UPDATE``) conflict
on them, and no surrogate column widens the rows or their secondary indexes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.conf import MAX_NAME_BYTES as NAME_LENGTH
from sqlqueue.naming import DEFAULT_PRIORITY

if TYPE_CHECKING:
    _BigAutoField = models.BigAutoField[int, int]
else:  # the field classes are generic for type checkers only
    _BigAutoField = models.BigAutoField


class UnsignedBigAutoField(_BigAutoField):
    """``BIGINT UNSIGNED AUTO_INCREMENT`` on MySQL/MariaDB, as the RFC's ``offset``.
    Elsewhere Django's own: a ``bigint`` identity on PostgreSQL (no unsigned types there;
    63 bits of offsets are plenty), ``integer AUTOINCREMENT`` on SQLite."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return "bigint UNSIGNED AUTO_INCREMENT"
        return super().db_type(connection)

    def rel_db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return "bigint UNSIGNED"
        return super().rel_db_type(connection)


def _name(**kwargs: Any) -> models.CharField[str, str]:
    return models.CharField(max_length=NAME_LENGTH, **kwargs)


def _epoch_ms(**kwargs: Any) -> models.PositiveBigIntegerField[int, int]:
    return models.PositiveBigIntegerField(**kwargs)


class QueueMessage(models.Model):
    """One published message: the immutable, shared log of every topic."""

    offset = UnsignedBigAutoField(primary_key=True)
    topic = _name()
    partition_key = _name()
    id = _name(help_text="Deduplication key within (topic, partition_key).")
    payload = models.BinaryField(help_text="UTF-8 JSON, at most MAX_PAYLOAD_BYTES.")
    metadata = models.JSONField(null=True, blank=True)
    created_at = _epoch_ms(help_text="Epoch ms, database clock, at insert.")
    published_at = _epoch_ms(help_text="Epoch ms, publisher's clock.")
    # Dead-letter columns (RFC): meaningful on rows of a dead-letter topic only.
    failed_at = _epoch_ms(db_default=0)
    failure_count = models.PositiveIntegerField(db_default=0)
    last_error = models.TextField(db_default="")
    original_topic = _name(db_default="")
    failure_detail = models.JSONField(null=True, blank=True)
    # Added by sqlqueue, each with a default (docs/reference/schema.md).
    priority = models.PositiveSmallIntegerField(
        db_default=DEFAULT_PRIORITY, help_text="0..255, lower is delivered first."
    )
    deliver_after = _epoch_ms(
        db_default=0, help_text="Epoch ms; not delivered before. 0 = at once."
    )
    consumer_group = _name(
        db_default="",
        help_text="'' = for every group; else only this group receives it (a replay), "
        "or, on a dead letter, the group whose attempts failed.",
    )

    class Meta:
        db_table = "queue_messages"
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "partition_key", "id"], name="idx_topic_partition_id"
            ),
        ]
        indexes = [
            models.Index(
                fields=["topic", "partition_key", "offset"], name="idx_topic_partition_offset"
            ),
            # A group's rows of some topics (its dead letters in the dead-letter topics,
            # its replays), without reading the other groups' (issue 52: the admin's
            # consumer-group filter of 100,000 dead letters).
            models.Index(
                fields=["consumer_group", "topic", "offset"], name="idx_group_topic_offset"
            ),
        ]
        verbose_name = "message"

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition_key}@{self.offset} ({self.id})"


class DeliveryState(models.Model):
    """Per consumer group, per message: acked, invisible until, retry count."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = _name()
    topic = _name()
    partition_key = _name()
    message_offset = models.PositiveBigIntegerField()
    acked = models.BooleanField(db_default=False)
    invisible_until = _epoch_ms(db_default=0)
    retry_count = models.PositiveIntegerField(db_default=0)
    postponed = models.BooleanField(db_default=False)
    # Added by sqlqueue.
    acked_at = _epoch_ms(db_default=0, help_text="Epoch ms, database clock; 0 = not acked.")
    last_error = models.TextField(
        db_default="", help_text="Traceback of the last failed attempt, while retrying."
    )

    class Meta:
        db_table = "queue_delivery_state"
        verbose_name = "delivery state"
        verbose_name_plural = "delivery states"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}@{self.message_offset}"


class PartitionLease(models.Model):
    """Which subscriber owns a (group, topic, partition), until when, with which generation.
    The row under the empty group records which server granted them (failover:
    ``sqlqueue.consuming.takeover``)."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = _name()
    topic = _name()
    partition_key = _name()
    leased_by = _name()
    leased_at = _epoch_ms()
    lease_renewed_at = _epoch_ms()
    # Added by sqlqueue: fencing token, incremented on every change of owner.
    generation = models.PositiveBigIntegerField(db_default=0)

    class Meta:
        db_table = "queue_partition_leases"
        indexes = [models.Index(fields=["lease_renewed_at"], name="idx_lease_renewed")]
        verbose_name = "partition lease"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key} by {self.leased_by}"


class PartitionOffset(models.Model):
    """The contiguous-ack watermark of a group on a partition."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = _name()
    topic = _name()
    partition_key = _name()
    offset_acked = models.PositiveBigIntegerField(
        db_default=0, help_text="Every offset <= this is done for the group."
    )
    updated_at = _epoch_ms()
    first_pending = models.PositiveBigIntegerField(
        null=True, blank=True,
        help_text="The first offset above the watermark the group has still to finish, as "
                  "its runconsumer saw it when it last moved the watermark: a hint that "
                  "spares the lag pages and metrics a probe (NULL: unknown).",
    )

    class Meta:
        db_table = "queue_offsets"
        # The RFC indexes (topic) only; garbage collection filters on the partition too.
        indexes = [models.Index(fields=["topic", "partition_key"], name="idx_topic_partition")]
        verbose_name = "partition offset"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}<={self.offset_acked}"


class SubscriberHeartbeat(models.Model):
    """A live subscriber of a (group, topic); rows older than the lease duration are dead."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "subscriber_name")
    consumer_group = _name()
    topic = _name()
    subscriber_name = _name()
    heartbeat_at = _epoch_ms()
    deregistered_at = _epoch_ms(db_default=0)

    class Meta:
        db_table = "queue_subscriber_heartbeats"
        verbose_name = "subscriber heartbeat"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {self.subscriber_name}"


class IdempotencyKey(models.Model):
    """An ``id`` given to ``send_message()``/``send_messages()``, remembered for
    ``IDEMPOTENCY_WINDOW`` after its first publish, so that publishing it again into the
    same (topic, partition_key) is absorbed also after its message was garbage-collected.

    Compact on purpose (docs/reference/schema.md, "Idempotency keys"): the key is a
    128-bit BLAKE2b digest of (topic, partition_key, id) in two BIGINTs, not the three
    strings; ids sqlqueue generates itself (UUIDv7) are never stored here.
    """

    pk = models.CompositePrimaryKey("key_high", "key_low")
    key_high = models.BigIntegerField(help_text="First 64 bits of the digest, signed.")
    key_low = models.BigIntegerField(help_text="Last 64 bits of the digest, signed.")
    message_offset = models.PositiveBigIntegerField(
        help_text="Offset of the message first published with this id.")
    expires_at = _epoch_ms(help_text="Epoch ms, database clock: first publish + window.")

    class Meta:
        db_table = "queue_idempotency_keys"
        indexes = [models.Index(fields=["expires_at"], name="idx_idempotency_expires")]
        verbose_name = "idempotency key"

    def __str__(self) -> str:
        return f"{self.key_high:016x}{self.key_low & (2**64 - 1):016x}@{self.message_offset}"


class FlowControl(models.Model):
    """A pause (added by sqlqueue, not in the RFC): while a row matches a (group, topic),
    its subscribers start no new handler. An empty ``consumer_group`` pauses every group
    of ``topic``; an empty ``topic`` pauses every topic of ``consumer_group``."""

    pk = models.CompositePrimaryKey("consumer_group", "topic")
    consumer_group = _name(blank=True)
    topic = _name(blank=True)
    paused_at = _epoch_ms()
    paused_by = _name(blank=True, db_default="")

    class Meta:
        db_table = "queue_flow_control"
        verbose_name = "pause"
        permissions = [
            ("pause_subscription", "Can pause and resume consumer groups"),
            ("retire_group", "Can retire a consumer group (delete its positions and state)"),
            ("cancel_message", "Can cancel pending messages of a consumer group"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group or '*'}:{self.topic or '*'} paused"


class RunnerAction(models.TextChoices):
    DRAIN = "drain", "drain and stop"
    STOP = "stop", "stop at once"


class RunnerRequest(models.Model):
    """An operator's request that one runner (``runconsumer``, by its subscriber name)
    stop: ``drain`` (finish the running handlers first, as on SIGTERM) or ``stop`` (at
    once). The runner reads its row once per lease renew interval, obeys a request made
    after it started, and stamps ``obeyed_at`` (added by sqlqueue, not in the RFC)."""

    runner_name = _name(primary_key=True)
    action = models.CharField(max_length=5, choices=RunnerAction.choices)
    requested_by = _name(blank=True, db_default="")
    requested_at = _epoch_ms()
    obeyed_at = _epoch_ms(db_default=0)

    class Meta:
        db_table = "queue_runner_requests"
        verbose_name = "runner request"
        permissions = [("stop_runner", "Can ask a runner to drain and stop, or to stop at once")]

    def __str__(self) -> str:
        return f"{self.runner_name}: {self.get_action_display()}"


#: A dead letter names the group that failed it and the topic it came from.
IS_DEAD_LETTER = ~models.Q(consumer_group="") & ~models.Q(original_topic="")


class DeadLetterManager(models.Manager["DeadLetter"]):
    def get_queryset(self) -> models.QuerySet[DeadLetter]:
        return super().get_queryset().filter(IS_DEAD_LETTER)


class DeadLetter(QueueMessage):
    """The dead-letter rows of ``queue_messages`` (a proxy: same table)."""

    objects: ClassVar[DeadLetterManager] = DeadLetterManager()

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        permissions = [
            ("replay_deadletter", "Can replay dead letters to their consumer group"),
            ("discard_deadletter", "Can discard dead letters"),
        ]


class ConsumerLag(QueueMessage):
    """The admin's lag dashboard (no rows of its own: it names the page and carries the
    permissions of the repairs made there)."""

    class Meta:
        proxy = True
        verbose_name = "consumer lag"
        verbose_name_plural = "consumer lag"
        permissions = [
            ("retry_now", "Can make backing-off messages deliverable now"),
            ("reset_position", "Can rewind or skip a group's position on a partition"),
        ]


class SubscriberStatus(QueueMessage):
    """The admin's page of live subscribers and their leases (no rows of its own)."""

    class Meta:
        proxy = True
        verbose_name = "subscriber"
        verbose_name_plural = "subscribers and leases"


class LiveOverview(QueueMessage):
    """The admin's live overview page (no rows of its own: the numbers are MinuteStats')."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "live overview"


# The results table of the Django Tasks backend (sqlqueue.integrations.tasks), defined
# next to the backend it serves; imported here so that it belongs to this app.
from sqlqueue.integrations.tasks.models import TaskRecord  # noqa: E402, F401


class ScheduleState(models.Model):
    """Where one entry of ``SQLQUEUE["SCHEDULES"]`` stands (added by sqlqueue, not in the
    RFC). ``checked_until``: every tick at or before it was published or skipped; a
    process claims the ticks after it by moving it forward with a compare-and-set, in the
    transaction that publishes them, so each tick is published once however many
    processes run (docs/guides/schedules.md)."""

    name = _name(primary_key=True)
    checked_until = _epoch_ms()
    #: the schedule's timing as last seen (``every 60`` / ``cron 0 3 * * * Europe/Paris``)
    definition = _name(blank=True, db_default="")
    last_tick = _epoch_ms(null=True)
    last_topic = _name(blank=True, db_default="")
    last_partition_key = _name(blank=True, db_default="")
    last_offset = models.PositiveBigIntegerField(null=True)
    last_message_id = _name(blank=True, db_default="")
    last_published_at = _epoch_ms(null=True)

    class Meta:
        db_table = "queue_schedules"
        verbose_name = "schedule"
        permissions = [("run_schedule", "Can publish a schedule's tick now")]

    def __str__(self) -> str:
        return self.name


class StoredSchedule(models.Model):
    """A schedule kept in the database besides ``SQLQUEUE["SCHEDULES"]`` (issue 42):
    created, edited, paused and run from the admin. ``entry`` is written exactly as an
    entry of the setting (``every`` or ``cron``, ``topic`` or ``task``, ...) and checked the
    same way; every ``runconsumer`` reloads these rows every few seconds. Its ticks are
    claimed through its ``queue_schedules`` row, as a setting's are: each is published
    once however many runners run."""

    name = _name(primary_key=True)
    entry = models.JSONField(help_text="The schedule, as an entry of SQLQUEUE['SCHEDULES'].")
    paused = models.BooleanField(default=False, help_text="A paused schedule publishes "
                                 "nothing; resumed, it starts from then (no catch-up).")
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = _name(blank=True, default="")

    class Meta:
        db_table = "queue_stored_schedules"
        verbose_name = "editable schedule"

    def __str__(self) -> str:
        return self.name


# The admin's per-minute rollup, in a module of its own (imported here: one of the app's
# models).
from sqlqueue.stats_models import MinuteStats as MinuteStats  # noqa: E402
