"""The live overview (issue 42): per (group, topic), what the runners handled in each
minute of the last hour, and handler duration percentiles, from the per-minute rollup
(``sqlqueue.operations.overview``). The page refreshes its numbers in place: a few lines
of plain JavaScript fetch its fragment again every ``REFRESH_SECONDS``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from sqlqueue.admin.activity_charts import (
    LATENCY,
    THROUGHPUT,
    latency_chart,
    legend,
    throughput_chart,
)
from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.conf import get_settings
from sqlqueue.models import LiveOverview
from sqlqueue.operations.overview import WINDOW_MINUTES, SubscriptionActivity, activity

REFRESH_SECONDS = 10


def _card(alias: str, sub: SubscriptionActivity) -> dict[str, Any]:
    name = f"{sub.group} on {sub.topic}"
    last = sub.minutes[-1]
    total = sub.total
    return {
        "sub": sub, "database": alias, "last": last,
        "rows": [(s.label, s.value(last), s.value(total),
                  (s.value(total) or 0) / WINDOW_MINUTES) for s in THROUGHPUT],
        "throughput": throughput_chart(
            sub.minutes, f"{name}: messages per minute over the last hour: "
            f"{total.published} published, {total.acked} acked, {total.retried} retried, "
            f"{total.dead_lettered} dead-lettered"),
        "latency": latency_chart(
            sub.minutes, f"{name}: handler duration p50 and p95 per minute over the last "
            f"hour (hour: p50 {_seconds(total.p50)}, p95 {_seconds(total.p95)})"),
    }


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g} s"


@admin.register(LiveOverview)
class LiveOverviewAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.overview_view),
                     name=f"{name}_changelist")]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = get_settings()
        cards = [_card(alias, sub) for alias in conf.databases
                 for sub in activity(conf.read_alias(alias))]
        fragment = request.GET.get("fragment") == "1"
        template = ("admin/sqlqueue/_activity.html" if fragment
                    else "admin/sqlqueue/activity_overview.html")
        return TemplateResponse(request, template, {
            **({} if fragment else self.admin_site.each_context(request)),
            "opts": self.opts, "title": "Live overview", "cards": cards,
            "several_databases": len(conf.databases) > 1, "minutes": WINDOW_MINUTES,
            "refresh_seconds": REFRESH_SECONDS,
            "throughput_legend": legend(THROUGHPUT), "latency_legend": legend(LATENCY),
        })
