"""The admin's page of task results (``queue_task_results``).

Registered by sqlqueue's ``AppConfig.ready()`` when the admin is installed. The list
shows each task's status, attempts, last attempt's duration and last error; a failed
task can be retried (its dead letter replayed) or discarded (its dead letter and result
deleted), from the list's actions or its own page, with the dead letters' permissions
and a confirmation page. A failed task's page links to its dead letter, and the dead
letter's page back to it. Results are never edited through a form.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.admin.dead_letters import register_dead_letter_link, register_dead_letter_subject
from sqlqueue.admin.display import MAX_SHOWN_CHARS
from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.admin.operator_pages import WithoutSchemaHelp
from sqlqueue.admin.pages import admin_url, confirmation_page
from sqlqueue.integrations.tasks.envelope import BadEnvelope, open_envelope
from sqlqueue.integrations.tasks.models import TaskRecord
from sqlqueue.integrations.tasks.repairs import (
    NotRetryable,
    TasksResult,
    dead_letter_of,
    discard_task,
    discard_tasks,
    retry_task,
    retry_tasks,
    task_of_dead_letter,
)
from sqlqueue.integrations.tasks.schedules import TaskTarget
from sqlqueue.models import DeadLetter
from sqlqueue.templatetags.sqlqueue_admin import last_line


def _pre(text: str) -> SafeString:
    """Escaped, in a <pre>, cut at MAX_SHOWN_CHARS characters."""
    cut = "\n... (cut)" if len(text) > MAX_SHOWN_CHARS else ""
    return format_html('<pre style="white-space: pre-wrap">{}{}</pre>',
                       text[:MAX_SHOWN_CHARS], cut)


def _json(value: Any) -> SafeString:
    return _pre(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))


def error_groups(errors: list[dict[str, Any]], attempts: int
                 ) -> list[tuple[int, int, dict[str, Any]]]:
    """Consecutive attempts that failed alike, as (first attempt, last attempt, error),
    attempts counted from 1: a task retried ten times on the same bug is one entry. The
    errors are those of the newest failed attempts (the record keeps the newest
    ``MAX_KEPT_ERRORS``), so the first is attempt ``attempts - len(errors) + 1``."""
    groups: list[tuple[int, int, dict[str, Any]]] = []
    for number, error in enumerate(errors, start=max(attempts - len(errors), 0) + 1):
        if groups and _same_error(groups[-1][2], error):
            groups[-1] = (groups[-1][0], number, groups[-1][2])
        else:
            groups.append((number, number, error))
    return groups


def _same_error(one: dict[str, Any], other: dict[str, Any]) -> bool:
    keys = ("exception_class_path", "traceback")
    return all(one.get(key) == other.get(key) for key in keys)


def _attempts_text(first: int, last: int) -> str:
    if first == last:
        return f"Attempt {first}"
    return f"Attempts {first}-{last} ({last - first + 1} times the same error)"


def duration_text(elapsed: timedelta) -> str:
    """A duration an operator reads at a glance: 0.25 s, 12.3 s, 4 min 5 s, 2 h 3 min."""
    seconds = elapsed.total_seconds()
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, second = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second} s"
    return f"{minutes // 60} h {minutes % 60} min"


class TaskRecordAdmin(WithoutSchemaHelp, ReadOnlyAdmin):
    # Narrow columns (the list fits 1366 px): the task's module, the queue, the finish time
    # and the id are on the task's page; the queue is a filter, the id and path searchable.
    list_display = ("task", "status", "attempts", "duration", "last_error",
                    "enqueued_at")
    list_filter = ("status", "backend", "queue_name")
    search_fields = ("=id", "task_path")
    ordering = ("-enqueued_at",)
    show_full_result_count = False  # no COUNT(*) over a big table on every page
    actions = ("retry", "discard")
    fields = ("id", "backend", "task_path", "queue_name", "priority", "run_after", "status",
              "dead_letter", "attempts", "duration", "arguments", "returned", "error_list",
              "worker_ids", "enqueued_at", "started_at", "last_attempted_at", "finished_at",
              "topic", "partition_key", "message_offset")
    readonly_fields = fields
    change_form_template = "admin/sqlqueue/taskrecord/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        # Before the default URLs: their "<path:object_id>/" would take these.
        return [path("<path:object_id>/retry/", wrap(self.retry_one_view),
                     name=f"{name}_retry_one"),
                path("<path:object_id>/discard/", wrap(self.discard_one_view),
                     name=f"{name}_discard_one"),
                *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> HttpResponse:
        """The task's page, with Retry and Discard for a failed task and who may use them."""
        record = self.get_object(request, object_id)
        failed = record is not None and dead_letter_of(record) is not None
        return super().change_view(request, object_id, form_url, {
            **(extra_context or {}),
            "may_retry": failed and self.has_replay_permission(request),
            "may_discard": failed and self.has_discard_permission(request),
            "retry_url": admin_url(self, "retry_one", object_id),
            "discard_url": admin_url(self, "discard_one", object_id),
        })

    # -- columns -------------------------------------------------------------------------
    @admin.display(description="task", ordering="task_path")
    def task(self, obj: TaskRecord) -> SafeString:
        """The task's name, its module in a tooltip (and on its page): the long dotted path
        would push the last error out of a laptop's window."""
        module, _, name = obj.task_path.rpartition(".")
        return format_html('<span title="{}">{}</span>', obj.task_path, name or module)

    @admin.display(description="attempts")
    def attempts(self, obj: TaskRecord) -> int:
        return len(obj.worker_ids)

    @admin.display(description="duration")
    def duration(self, obj: TaskRecord) -> str:
        """How long the last attempt ran, for a finished task."""
        if obj.finished_at is None or obj.last_attempted_at is None:
            return "-"
        return duration_text(obj.finished_at - obj.last_attempted_at)

    @admin.display(description="last error")
    def last_error(self, obj: TaskRecord) -> str:
        """The newest error's exception line (why it failed), cut at 120 characters."""
        if not obj.errors:
            return "-"
        newest = obj.errors[-1]
        line = last_line(str(newest.get("traceback", ""))) or newest.get(
            "exception_class_path", "?")
        return line if len(line) <= 120 else line[:119] + "…"

    @admin.display(description="dead letter")
    def dead_letter(self, obj: TaskRecord) -> SafeString:
        """A failed task's message is a dead letter of the backend's group: its page."""
        dead = dead_letter_of(obj)
        if dead is None:
            return format_html("<span>{}</span>", "-")
        return format_html(
            '<a id="sqlqueue-task-dead-letter" href="{}">Dead letter {}</a> (retrying the '
            "task replays it)",
            reverse("admin:sqlqueue_deadletter_change", args=[dead.offset],
                    current_app=self.admin_site.name), dead.offset)

    @admin.display(description="arguments")
    def arguments(self, obj: TaskRecord) -> SafeString:
        return _json({"args": obj.args, "kwargs": obj.kwargs})

    @admin.display(description="return value")
    def returned(self, obj: TaskRecord) -> SafeString:
        return _json(obj.return_value)

    @admin.display(description="errors")
    def error_list(self, obj: TaskRecord) -> SafeString:
        """One entry per run of consecutive attempts that failed with the same traceback
        ("attempts 1-10: the same error"), not ten identical tracebacks; each traceback
        folded but the newest."""
        if not obj.errors:
            return format_html("<span>{}</span>", "-")
        groups = error_groups(obj.errors, len(obj.worker_ids))
        return format_html_join("", (
            '<div class="sqlqueue-task-error"><p><strong>{}</strong>: {}</p>'
            "<details{}><summary>traceback</summary>{}</details></div>"),
            ((_attempts_text(first, last), error.get("exception_class_path", "?"),
              " open" if index == len(groups) - 1 else "",
              _pre(str(error.get("traceback", ""))))
             for index, (first, last, error) in enumerate(groups)))

    # -- permissions: those of the dead letters the actions replay or discard ------------
    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.replay_deadletter")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.discard_deadletter")

    # -- actions -------------------------------------------------------------------------
    @admin.action(description="Retry failed tasks (replay their dead letters)",
                  permissions=["replay"])
    def retry(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._report(request, "Retried", retry_tasks(queryset.values_list("pk", flat=True)))

    @admin.action(description="Discard failed tasks for good", permissions=["discard"])
    def discard(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> Any:
        if request.POST.get("confirmed") != "yes":
            return TemplateResponse(request, "admin/sqlqueue/confirm_discard_tasks.html", {
                **self.admin_site.each_context(request),
                "title": "Discard failed tasks?", "opts": self.opts,
                "tasks": queryset[:100], "count": queryset.count(),
                "ids": list(queryset.values_list("pk", flat=True)),
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            })
        self._report(request, "Discarded",
                     discard_tasks(queryset.values_list("pk", flat=True)))
        return None

    def retry_one_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._one(request, object_id, "retry")

    def discard_one_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._one(request, object_id, "discard")

    def _one(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Retry or discard the task of the page: GET asks, a POST that confirms does it."""
        allowed = (self.has_replay_permission(request) if action == "retry"
                   else self.has_discard_permission(request))
        if not (self.has_view_permission(request) and allowed):
            raise PermissionDenied
        record = self.get_object(request, object_id)
        dead = dead_letter_of(record) if record is not None else None
        if record is None or dead is None:
            self.message_user(request, f"Task {object_id} has no dead letter: it did not "
                              "fail, or was retried or discarded already.", messages.WARNING)
            return HttpResponseRedirect(admin_url(self, "changelist"))
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            try:
                if action == "retry":
                    retry_task(record.pk)
                else:
                    discard_task(record.pk)
            except NotRetryable as gone:
                self.message_user(request, str(gone), messages.WARNING)
            else:
                verb = "Retried" if action == "retry" else "Discarded"
                self._report(request, verb, TasksResult(done=1))
            return HttpResponseRedirect(admin_url(self, "changelist"))
        return confirmation_page(
            self, request, "admin/sqlqueue/confirm_task.html", object_id,
            title=f"{action.capitalize()} task {record.task_path}?", action=action,
            task=record, dead=dead, original=record, summary=self.last_error(record))

    def _report(self, request: HttpRequest, verb: str, result: TasksResult) -> None:
        self.message_user(request, f"{verb} {result.done} task(s).", messages.SUCCESS)
        if result.skipped:
            self.message_user(request, f"{len(result.skipped)} had no dead letter (not "
                              "failed, or retried or discarded already).", messages.WARNING)


def task_result_link(dead: DeadLetter, admin_site: str) -> SafeString | None:
    """On a dead letter's page: the result page of the task whose message it is, where
    the task can be retried or discarded (None: not a task's message)."""
    record = task_of_dead_letter(dead)
    if record is None:
        return None
    try:
        url = reverse("admin:sqlqueue_taskrecord_change", args=[record.pk],
                      current_app=admin_site)
    except NoReverseMatch:  # the results page is not registered on that site
        return None
    return format_html('<a id="sqlqueue-dead-letter-task" href="{}">{} ({})</a>', url,
                       record.task_path, record.get_status_display())


def task_of_message(dead: DeadLetter) -> str | None:
    """A dead letter of a Tasks backend's topic: "task <its dotted path>", from the
    envelope (no result row needed: collected, it still names the task), as the worker's
    ``describe_message`` names it in the failure log lines (issue 53, F17)."""
    if not TaskTarget().owns_topic(dead.original_topic):
        return None
    try:  # the stored payload: UTF-8 JSON bytes (a memoryview on PostgreSQL)
        return f"task {open_envelope(json.loads(bytes(dead.payload))).task_path}"
    except (BadEnvelope, ValueError, TypeError):  # not JSON, or not a task's envelope
        return None


admin.site.register(TaskRecord, TaskRecordAdmin)
register_dead_letter_link(task_result_link)
register_dead_letter_subject(task_of_message)
