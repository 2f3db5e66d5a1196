"""The admin's read-only page of task results (``queue_task_results``).

Registered by sqlqueue's ``AppConfig.ready()`` when the admin is installed. The list
shows each failed task's last error; a failed task's page links to its dead letter's
replay (the dead-letter page's, with its confirmation): this page itself changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.integrations.tasks.models import Status, TaskRecord
from sqlqueue.models import DeadLetter
from sqlqueue.templatetags.sqlqueue_admin import last_line

MAX_SHOWN_CHARS = 20_000


def _pre(text: str) -> SafeString:
    """Escaped, in a <pre>, cut at MAX_SHOWN_CHARS characters."""
    cut = "\n... (cut)" if len(text) > MAX_SHOWN_CHARS else ""
    return format_html('<pre style="white-space: pre-wrap">{}{}</pre>',
                       text[:MAX_SHOWN_CHARS], cut)


def _json(value: Any) -> SafeString:
    return _pre(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))


def failed_task_dead_letter(record: TaskRecord) -> DeadLetter | None:
    """The dead letter of a FAILED task's message (its topic, partition and offset, which
    the dead letter's failure detail records), if it is still kept."""
    if record.status != Status.FAILED or record.message_offset is None:
        return None
    return (DeadLetter.objects.using(record._state.db or "default")
            .filter(original_topic=record.topic, partition_key=record.partition_key,
                    failure_detail__offset=record.message_offset)
            .order_by("-offset").first())


class TaskRecordAdmin(ReadOnlyAdmin):
    list_display = ("task_path", "status", "attempts", "last_error", "queue_name",
                    "enqueued_at", "finished_at", "id")
    list_filter = ("status", "backend", "queue_name")
    search_fields = ("=id", "task_path")
    ordering = ("-enqueued_at",)
    show_full_result_count = False  # no COUNT(*) over a big table on every page
    fields = ("id", "backend", "task_path", "queue_name", "priority", "run_after", "status",
              "replay", "attempts", "arguments", "returned", "error_list", "worker_ids",
              "enqueued_at", "started_at", "last_attempted_at", "finished_at", "topic",
              "partition_key", "message_offset")
    readonly_fields = fields

    @admin.display(description="attempts")
    def attempts(self, obj: TaskRecord) -> int:
        return len(obj.worker_ids)

    @admin.display(description="last error")
    def last_error(self, obj: TaskRecord) -> str:
        """The newest error's exception line (why it failed), cut at 120 characters."""
        if not obj.errors:
            return "-"
        newest = obj.errors[-1]
        line = last_line(str(newest.get("traceback", ""))) or newest.get(
            "exception_class_path", "?")
        return line if len(line) <= 120 else line[:119] + "…"

    @admin.display(description="run again")
    def replay(self, obj: TaskRecord) -> SafeString:
        """A FAILED task's message is a dead letter of the backend's group: replaying it
        runs the task again (same result id, earlier errors kept)."""
        dead = failed_task_dead_letter(obj)
        if dead is None:
            return format_html("<span>{}</span>", "-")
        return format_html(
            '<a class="button" id="sqlqueue-replay-task" href="{}">Replay its dead letter '
            "{}</a>", reverse("admin:sqlqueue_deadletter_replay_one", args=[dead.offset]),
            dead.offset)

    @admin.display(description="arguments")
    def arguments(self, obj: TaskRecord) -> SafeString:
        return _json({"args": obj.args, "kwargs": obj.kwargs})

    @admin.display(description="return value")
    def returned(self, obj: TaskRecord) -> SafeString:
        return _json(obj.return_value)

    @admin.display(description="errors")
    def error_list(self, obj: TaskRecord) -> SafeString:
        if not obj.errors:
            return format_html("<span>{}</span>", "-")
        return format_html_join(
            "", "<p><strong>{}</strong></p>{}",
            ((e.get("exception_class_path", "?"), _pre(str(e.get("traceback", ""))))
             for e in obj.errors),
        )


admin.site.register(TaskRecord, TaskRecordAdmin)
