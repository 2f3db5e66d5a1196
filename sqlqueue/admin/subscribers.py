"""Subscribers and leases: who is alive, what each holds, whether the split is fair, and
leases nobody renews any more; and the runners, each of which an operator may ask to
drain and stop or to stop at once (issue 42)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.admin.pages import REFRESH_SECONDS, admin_url
from sqlqueue.conf import get_settings
from sqlqueue.models import RunnerAction, RunnerRequest, SubscriberStatus
from sqlqueue.operations.runners import (
    NotARunningRunner,
    live_runners,
    pending_requests,
    request_runner_stop,
    stopped_runners,
)
from sqlqueue.operations.subscribers import memberships

#: partition keys listed per subscriber before "and N more"
KEYS_SHOWN = 12


def _when(epoch_ms: int) -> datetime:
    """A database-time stamp as an aware datetime (the template shows it in the
    admin's time zone)."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


@admin.register(SubscriberStatus)
class SubscriberStatusAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [path("", wrap(self.subscribers_view), name=f"{name}_changelist"),
                path("stop-runner/", wrap(self.stop_runner_view), name=f"{name}_stop_runner")]

    def has_stop_runner_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.stop_runner")

    def subscribers_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = get_settings()
        pending = {p.runner: p for p in pending_requests()}
        return TemplateResponse(request, "admin/sqlqueue/subscribers.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Subscribers and leases",
            "memberships": [m for alias in conf.databases
                            for m in memberships(conf.read_alias(alias))],
            "runners": [(name, pending.get(name)) for name in live_runners()],
            "stopped_runners": [(r, _when(r.requested_at_ms), _when(r.obeyed_at_ms))
                                for r in stopped_runners()],
            "refresh_seconds": REFRESH_SECONDS,
            "may_stop_runners": self.has_stop_runner_permission(request),
            "stop_runner_url": admin_url(self, "stop_runner"),
            "keys_shown": KEYS_SHOWN,
            "lease_duration": conf.LEASE_DURATION,
            "renew_interval": conf.LEASE_RENEW_INTERVAL,
        })

    def stop_runner_view(self, request: HttpRequest) -> HttpResponse:
        """Ask a runner to drain and stop, or to stop at once: GET asks the operator, a
        POST that confirms writes the request (logged with who asked)."""
        if not (self.has_view_permission(request) and self.has_stop_runner_permission(request)):
            raise PermissionDenied
        runner = request.GET.get("runner", "")
        action = request.GET.get("action", "")
        back = admin_url(self, "changelist")
        if action not in RunnerAction.values:
            self.message_user(request, f"Unknown action {action!r}.", messages.ERROR)
            return HttpResponseRedirect(back)
        label = RunnerAction(action).label
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            try:
                request_runner_stop(runner, action, by=request.user.get_username())
            except NotARunningRunner as exc:
                self.message_user(request, str(exc), messages.WARNING)
                return HttpResponseRedirect(back)
            self.log_change(request, RunnerRequest.objects.get(runner_name=runner),
                            f"Asked runner {runner} to {label}.")
            self.message_user(request, (
                f"Asked runner {runner} to {label}; it obeys within "
                f"{get_settings().LEASE_RENEW_INTERVAL:g} s (its lease renew interval)."),
                messages.SUCCESS)
            return HttpResponseRedirect(back)
        return TemplateResponse(request, "admin/sqlqueue/confirm_stop_runner.html", {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": f"Ask runner {runner} to {label}?",
            "runner": runner, "action": action, "label": label,
            "live": runner in live_runners(), "back_url": back,
            "renew_interval": get_settings().LEASE_RENEW_INTERVAL,
            "shutdown_timeout": get_settings().SHUTDOWN_TIMEOUT,
        })

