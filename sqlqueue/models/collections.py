"""Deep garbage collections, as the admin shows them (issue 52): one row per run of
``manage.py queue gc`` (``queue_gc_runs``), written as it goes, so that an operator who
finds a collection deleting millions of rows sees who runs it, how far it got and how
fast it goes."""

from __future__ import annotations

from django.db import models

from sqlqueue.models.fields import epoch_ms_field, name_field


class CollectionRun(models.Model):
    """A run of ``manage.py queue gc``: ``collector`` says which (the command, the host
    and its process id), the times are epoch ms of that host's clock, ``finished_at`` is
    0 while it runs, and ``messages`` counts the rows of the log it deleted so far."""

    collector = name_field(primary_key=True)
    started_at = epoch_ms_field()
    updated_at = epoch_ms_field()
    finished_at = epoch_ms_field(db_default=0)
    messages = models.PositiveBigIntegerField(db_default=0)
    share = models.FloatField(db_default=1.0, help_text="The part of its time spent deleting.")

    class Meta:
        db_table = "queue_gc_runs"
        verbose_name = "garbage collection run"

    def __str__(self) -> str:
        return f"{self.collector}: {self.messages} deleted"
