"""The per-minute rollup behind the admin's live overview (issue 42): one row per
(group, topic, minute), kept by the runners (``sqlqueue.consuming.rollup``) and collected
by garbage collection.

The outcome columns are the labels of ``sqlqueue_handled_total`` and the duration columns
the buckets of ``sqlqueue_handler_duration_seconds`` (``DURATION_BUCKETS``, not
cumulative: ``duration_00`` counts runs up to the first bound, ``duration_14`` those past
the last), so that the page's numbers and percentiles agree with ``/metrics``.
"""

from __future__ import annotations

from django.db import models

from sqlqueue.conf import DURATION_BUCKETS
from sqlqueue.conf import MAX_NAME_BYTES as NAME_LENGTH

#: the outcome columns, the labels of ``sqlqueue_handled_total``
OUTCOMES = ("ack", "acked", "retry", "fail", "reject")
#: one column per duration bucket, and one for the runs past the last bound
DURATION_COLUMNS = tuple(f"duration_{i:02d}" for i in range(len(DURATION_BUCKETS) + 1))


def _count() -> models.PositiveBigIntegerField[int, int]:
    return models.PositiveBigIntegerField(db_default=0)


class MinuteStats(models.Model):
    """What the runners handled in one minute (database time) for a group and topic.

    ``published``: messages first delivered to the group, counted in the minute they were
    published (their ``created_at``); ``dead_lettered``: runs that ended in a dead letter
    (a reject, or a failure at the last attempt)."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "minute")
    consumer_group = models.CharField(max_length=NAME_LENGTH)
    topic = models.CharField(max_length=NAME_LENGTH)
    minute = models.PositiveBigIntegerField(help_text="Epoch ms of the minute's start.")
    published = _count()
    dead_lettered = _count()
    ack = _count()
    acked = _count()
    retry = _count()
    fail = _count()
    reject = _count()
    duration_sum = models.FloatField(db_default=0.0)

    class Meta:
        db_table = "queue_minute_stats"
        verbose_name = verbose_name_plural = "minute stats"
        # The live overview reads the last hour of a day kept, garbage collection the
        # minutes past the day: ranges of minutes, across every (group, topic) (issue 52:
        # at 1,500 topics a day is two million rows, read whole by the primary key).
        indexes = [models.Index(fields=["minute"], name="idx_minute_stats_minute")]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} at {self.minute}"


for _column in DURATION_COLUMNS:
    MinuteStats.add_to_class(_column, _count())
