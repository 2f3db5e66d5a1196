"""Schedules (sqlqueue's own tables): where each schedule stands (``queue_schedules``) and
the schedules kept in the database, edited from the admin (``queue_stored_schedules``)."""

from __future__ import annotations

from django.db import models

from sqlqueue.models.fields import epoch_ms_field, name_field


class ScheduleState(models.Model):
    """Where one entry of ``SQLQUEUE["SCHEDULES"]`` stands (added by sqlqueue, not in the
    RFC). ``checked_until``: every tick at or before it was published or skipped; a
    process claims the ticks after it by moving it forward with a compare-and-set, in the
    transaction that publishes them, so each tick is published once however many
    processes run (docs/guides/schedules.md)."""

    name = name_field(primary_key=True)
    checked_until = epoch_ms_field()
    #: the schedule's timing as last seen (``every 60`` / ``cron 0 3 * * * Europe/Paris``)
    definition = name_field(blank=True, db_default="")
    last_tick = epoch_ms_field(null=True)
    last_topic = name_field(blank=True, db_default="")
    last_partition_key = name_field(blank=True, db_default="")
    last_offset = models.PositiveBigIntegerField(null=True)
    last_message_id = name_field(blank=True, db_default="")
    last_published_at = epoch_ms_field(null=True)

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

    name = name_field(primary_key=True)
    entry = models.JSONField(help_text="The schedule, as an entry of SQLQUEUE['SCHEDULES'].")
    paused = models.BooleanField(default=False, help_text="A paused schedule publishes "
                                 "nothing; resumed, it starts from then (no catch-up).")
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = name_field(blank=True, default="")

    class Meta:
        db_table = "queue_stored_schedules"
        verbose_name = "editable schedule"

    def __str__(self) -> str:
        return self.name
