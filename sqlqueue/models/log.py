"""The log: ``queue_messages``, the immutable, shared log of every topic (the RFC's), its
dead letters (a proxy on the same table), and the ids of the caller's remembered for
``IDEMPOTENCY_WINDOW`` (``queue_idempotency_keys``, sqlqueue's own)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from sqlqueue.models.fields import UnsignedBigAutoField, epoch_ms_field, name_field
from sqlqueue.naming import DEFAULT_PRIORITY


class QueueMessage(models.Model):
    """One published message: the immutable, shared log of every topic."""

    offset = UnsignedBigAutoField(primary_key=True)
    topic = name_field()
    partition_key = name_field()
    id = name_field(help_text="Deduplication key within (topic, partition_key).")
    payload = models.BinaryField(help_text="UTF-8 JSON, at most MAX_PAYLOAD_BYTES.")
    metadata = models.JSONField(null=True, blank=True)
    created_at = epoch_ms_field(help_text="Epoch ms, database clock, at insert.")
    published_at = epoch_ms_field(help_text="Epoch ms, publisher's clock.")
    # Dead-letter columns (RFC): meaningful on rows of a dead-letter topic only.
    failed_at = epoch_ms_field(db_default=0)
    failure_count = models.PositiveIntegerField(db_default=0)
    last_error = models.TextField(db_default="")
    original_topic = name_field(db_default="")
    failure_detail = models.JSONField(null=True, blank=True)
    # Added by sqlqueue, each with a default (docs/reference/schema.md).
    priority = models.PositiveSmallIntegerField(
        db_default=DEFAULT_PRIORITY, help_text="0..255, lower is delivered first."
    )
    deliver_after = epoch_ms_field(
        db_default=0, help_text="Epoch ms; not delivered before. 0 = at once."
    )
    consumer_group = name_field(
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


class IdempotencyKey(models.Model):
    """An ``id`` given to ``send_message()``/``send_messages()``, remembered for
    ``IDEMPOTENCY_WINDOW`` after its first publish, so that publishing it again into the
    same (topic, partition_key) is absorbed also after its message was garbage-collected.

    Compact on purpose (docs/reference/schema.md, "The idempotency keys table
    (queue_idempotency_keys)"): the key is a 128-bit BLAKE2b digest of (topic,
    partition_key, id) in two BIGINTs, not the three strings; ids sqlqueue generates
    itself (UUIDv7) are never stored here.
    """

    pk = models.CompositePrimaryKey("key_high", "key_low")
    key_high = models.BigIntegerField(help_text="First 64 bits of the digest, signed.")
    key_low = models.BigIntegerField(help_text="Last 64 bits of the digest, signed.")
    message_offset = models.PositiveBigIntegerField(
        help_text="Offset of the message first published with this id.")
    expires_at = epoch_ms_field(help_text="Epoch ms, database clock: first publish + window.")

    class Meta:
        db_table = "queue_idempotency_keys"
        indexes = [models.Index(fields=["expires_at"], name="idx_idempotency_expires")]
        verbose_name = "idempotency key"

    def __str__(self) -> str:
        return f"{self.key_high:016x}{self.key_low & (2**64 - 1):016x}@{self.message_offset}"
