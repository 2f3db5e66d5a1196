"""What operators ask of the consumers (sqlqueue's own tables): pauses of a group or a
topic (``queue_flow_control``) and requests that a runner stop (``queue_runner_requests``)."""

from __future__ import annotations

from django.db import models

from sqlqueue.models.fields import epoch_ms_field, name_field


class FlowControl(models.Model):
    """A pause (added by sqlqueue, not in the RFC): while a row matches a (group, topic),
    its subscribers start no new handler. An empty ``consumer_group`` pauses every group
    of ``topic``; an empty ``topic`` pauses every topic of ``consumer_group``."""

    pk = models.CompositePrimaryKey("consumer_group", "topic")
    consumer_group = name_field(blank=True)
    topic = name_field(blank=True)
    paused_at = epoch_ms_field()
    paused_by = name_field(blank=True, db_default="")

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

    runner_name = name_field(primary_key=True)
    action = models.CharField(max_length=5, choices=RunnerAction.choices)
    requested_by = name_field(blank=True, db_default="")
    requested_at = epoch_ms_field()
    obeyed_at = epoch_ms_field(db_default=0)

    class Meta:
        db_table = "queue_runner_requests"
        verbose_name = "runner request"
        permissions = [("stop_runner", "Can ask a runner to drain and stop, or to stop at once")]

    def __str__(self) -> str:
        return f"{self.runner_name}: {self.get_action_display()}"
