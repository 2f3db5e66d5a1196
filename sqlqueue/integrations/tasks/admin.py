"""The admin's read-only page of task results (``queue_task_results``).

Registered by sqlqueue's ``AppConfig.ready()`` when the admin is installed. Failed tasks
are replayed from the dead-letter page, like any dead letter: this page only shows.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.integrations.tasks.models import TaskRecord

MAX_SHOWN_CHARS = 20_000


def _pre(text: str) -> SafeString:
    """Escaped, in a <pre>, cut at MAX_SHOWN_CHARS characters."""
    cut = "\n... (cut)" if len(text) > MAX_SHOWN_CHARS else ""
    return format_html('<pre style="white-space: pre-wrap">{}{}</pre>',
                       text[:MAX_SHOWN_CHARS], cut)


def _json(value: Any) -> SafeString:
    return _pre(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))


class TaskRecordAdmin(ReadOnlyAdmin):
    list_display = ("task_path", "status", "attempts", "queue_name", "enqueued_at",
                    "finished_at", "id")
    list_filter = ("status", "backend", "queue_name")
    search_fields = ("=id", "task_path")
    ordering = ("-enqueued_at",)
    show_full_result_count = False  # no COUNT(*) over a big table on every page
    fields = ("id", "backend", "task_path", "queue_name", "priority", "run_after", "status",
              "attempts", "arguments", "returned", "error_list", "worker_ids", "enqueued_at",
              "started_at", "last_attempted_at", "finished_at", "topic", "partition_key",
              "message_offset")
    readonly_fields = fields

    @admin.display(description="attempts")
    def attempts(self, obj: TaskRecord) -> int:
        return len(obj.worker_ids)

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
