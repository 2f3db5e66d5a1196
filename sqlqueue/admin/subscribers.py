"""Subscribers and leases: who is alive, what each holds, whether the split is fair, and
leases nobody renews any more."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.conf import get_settings
from sqlqueue.models import SubscriberStatus
from sqlqueue.operations.subscribers import memberships

#: partition keys listed per subscriber before "and N more"
KEYS_SHOWN = 12


@admin.register(SubscriberStatus)
class SubscriberStatusAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.subscribers_view),
                     name=f"{name}_changelist")]

    def subscribers_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = get_settings()
        return TemplateResponse(request, "admin/sqlqueue/subscribers.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Subscribers and leases",
            "memberships": [m for alias in conf.databases
                            for m in memberships(conf.read_alias(alias))],
            "keys_shown": KEYS_SHOWN,
            "lease_duration": conf.LEASE_DURATION,
            "renew_interval": conf.LEASE_RENEW_INTERVAL,
        })
