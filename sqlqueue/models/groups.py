"""What each consumer group keeps per topic (the RFC's four per-group tables): delivery
state per message, a lease per partition, a watermark per partition, a heartbeat per
subscriber."""

from __future__ import annotations

from django.db import models

from sqlqueue.models.fields import epoch_ms_field, name_field


class DeliveryState(models.Model):
    """Per consumer group, per message: acked, invisible until, retry count."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = name_field()
    topic = name_field()
    partition_key = name_field()
    message_offset = models.PositiveBigIntegerField()
    acked = models.BooleanField(db_default=False)
    invisible_until = epoch_ms_field(db_default=0)
    retry_count = models.PositiveIntegerField(db_default=0)
    postponed = models.BooleanField(db_default=False)
    # Added by sqlqueue.
    acked_at = epoch_ms_field(db_default=0, help_text="Epoch ms, database clock; 0 = not acked.")
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
    consumer_group = name_field()
    topic = name_field()
    partition_key = name_field()
    leased_by = name_field()
    leased_at = epoch_ms_field()
    lease_renewed_at = epoch_ms_field()
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
    consumer_group = name_field()
    topic = name_field()
    partition_key = name_field()
    offset_acked = models.PositiveBigIntegerField(
        db_default=0, help_text="Every offset <= this is done for the group."
    )
    updated_at = epoch_ms_field()
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
    consumer_group = name_field()
    topic = name_field()
    subscriber_name = name_field()
    heartbeat_at = epoch_ms_field()
    deregistered_at = epoch_ms_field(db_default=0)

    class Meta:
        db_table = "queue_subscriber_heartbeats"
        verbose_name = "subscriber heartbeat"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {self.subscriber_name}"
