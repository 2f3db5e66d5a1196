"""The schedules page, the admin's one entry for schedules (issue 53, F10): every entry of
``SQLQUEUE["SCHEDULES"]`` (read-only) and every stored schedule (edited through its own
form, issue 42; paused and resumed here) with its next tick, the last tick it published
(with a link to its message while it is still stored, F2) and how each consumer group
fared with it, and "Run now" for operators with ``sqlqueue.run_schedule``."""

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
from sqlqueue.operations.stored_schedules import set_paused


@admin.register(ScheduleState)
class ScheduleStateAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", wrap(self.schedules_view), name=f"{name}_changelist"),
            path("run/", wrap(self.run_view), name=f"{name}_run"),
            path("pause/", wrap(self.pause_view), name=f"{name}_pause"),
        ]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Who may see the stored schedules sees them here, their one page."""
        return super().has_view_permission(request, obj) or may_see_stored(request)

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
            "may_pause": request.user.has_perm("sqlqueue.change_storedschedule"),
            "may_view_messages": request.user.has_perm("sqlqueue.view_queuemessage"),
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

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``name`` and ``paused`` ("1" or "0"): pause or resume a stored schedule."""
        if not request.user.has_perm("sqlqueue.change_storedschedule"):
            raise PermissionDenied
        if request.method != "POST":
            raise PermissionDenied
        name, paused = request.POST.get("name", ""), request.POST.get("paused") == "1"
        changed = set_paused([name], paused, by=request.user.get_username())
        verb = "Paused" if paused else "Resumed (from now: missed ticks are not published)"
        if changed:
            self.message_user(request, f"{verb}: {name}.", messages.SUCCESS)
        else:
            self.message_user(request, f"No stored schedule {name!r} to "
                                       f"{'pause' if paused else 'resume'}.", messages.WARNING)
        return HttpResponseRedirect(reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"))


def may_see_stored(request: HttpRequest) -> bool:
    """Whether the user may see the stored schedules (Django's rule: view or change)."""
    return any(request.user.has_perm(f"sqlqueue.{perm}_storedschedule")
               for perm in ("view", "change"))


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
