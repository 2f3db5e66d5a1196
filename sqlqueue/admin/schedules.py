"""The schedules page: every entry of ``SQLQUEUE["SCHEDULES"]`` (read-only) and every
stored schedule (edited on its own admin page, issue 42) with its next tick, the last
tick it published (with its message) and how each consumer group fared with it, and
"Run now" for operators with ``sqlqueue.run_schedule``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.models import ScheduleState
from sqlqueue.operations.schedules import (
    UnknownSchedule,
    current_time_ms,
    run_schedule_now,
    schedule_overview,
)


@admin.register(ScheduleState)
class ScheduleStateAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", wrap(self.schedules_view), name=f"{name}_changelist"),
            path("run/", wrap(self.run_view), name=f"{name}_run"),
        ]

    def schedules_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(request, "admin/sqlqueue/schedules.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Schedules",
            "schedules": schedule_overview(current_time_ms()),
            "may_run": request.user.has_perm("sqlqueue.run_schedule"),
            "may_add": request.user.has_perm("sqlqueue.add_storedschedule"),
            "may_edit": request.user.has_perm("sqlqueue.view_storedschedule"),
        })

    def run_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``name``: publish one tick of that schedule now."""
        if not request.user.has_perm("sqlqueue.run_schedule"):
            raise PermissionDenied
        if request.method != "POST":
            raise PermissionDenied
        run_now_and_tell(self, request, request.POST.get("name", ""))
        return HttpResponseRedirect(reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"))


def run_now_and_tell(model_admin: admin.ModelAdmin[Any], request: HttpRequest,
                     name: str) -> None:
    """Publish one tick of schedule ``name`` now, and tell the operator which message it
    was (or why there was none)."""
    try:
        tick = run_schedule_now(name)
    except UnknownSchedule as error:
        model_admin.message_user(request, str(error), messages.ERROR)
    else:
        model_admin.message_user(request, f"Published a tick of {name}: message "
                                          f"{tick.message_id} (offset {tick.offset}).",
                                 messages.SUCCESS)
