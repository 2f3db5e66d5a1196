"""The live overview (issue 42): per (group, topic), what the runners handled in each
minute of the last 15 minutes, 30 minutes or hour (``RANGES``), and handler duration
percentiles, from the per-minute rollup (``sqlqueue.operations.overview``). The page
refreshes its numbers in place: a few lines of plain JavaScript fetch its fragment again
every ``REFRESH_SECONDS``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from sqlqueue.admin.activity_charts import (
    LATENCY,
    THROUGHPUT,
    latency_chart,
    legend,
    series_style,
    throughput_chart,
)
from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.admin.pages import REFRESH_SECONDS
from sqlqueue.conf import get_settings
from sqlqueue.models import LiveOverview
from sqlqueue.operations.overview import WINDOW_MINUTES, SubscriptionActivity, activity

#: the ranges the page offers, in minutes: at most ``WINDOW_MINUTES``, because the runners
#: keep the per-minute rows only a little longer (``sqlqueue.consuming.rollup.KEEP_MS``)
RANGES = (15, 30, WINDOW_MINUTES)


def _range_name(minutes: int) -> str:
    return "1 h" if minutes == 60 else f"{minutes} min"


def _card(alias: str, sub: SubscriptionActivity, minutes: int) -> dict[str, Any]:
    name = f"{sub.group} on {sub.topic}"
    span = "the last hour" if minutes == 60 else f"the last {minutes} minutes"
    last = sub.minutes[-1]
    total = sub.total
    return {
        "sub": sub, "database": alias, "last": last,
        "rows": [(s.label, s.value(last), s.value(total),
                  (s.value(total) or 0) / minutes) for s in THROUGHPUT],
        "throughput": throughput_chart(
            sub.minutes, f"{name}: messages per minute over {span}: "
            f"{total.published} published, {total.acked} acked, {total.retried} retried, "
            f"{total.dead_lettered} dead-lettered"),
        "latency": latency_chart(
            sub.minutes, f"{name}: handler duration p50 and p95 per minute over {span} "
            f"(whole range: p50 {_seconds(total.p50)}, p95 {_seconds(total.p95)})"),
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
        raw = request.GET.get("minutes", str(WINDOW_MINUTES))
        if raw not in {str(r) for r in RANGES}:
            return HttpResponseBadRequest(
                f"minutes={raw!r} is not a range this page shows: choose one of "
                f"{', '.join(map(str, RANGES))}.", content_type="text/plain")
        minutes = int(raw)
        conf = get_settings()
        cards = [_card(alias, sub, minutes) for alias in conf.databases
                 for sub in activity(conf.read_alias(alias), minutes=minutes)]
        fragment = request.GET.get("fragment") == "1"
        template = ("admin/sqlqueue/_activity.html" if fragment
                    else "admin/sqlqueue/activity_overview.html")
        return TemplateResponse(request, template, {
            **({} if fragment else self.admin_site.each_context(request)),
            "opts": self.opts, "title": "Live overview", "cards": cards,
            "several_databases": len(conf.databases) > 1, "minutes": minutes,
            "ranges": [(r, _range_name(r)) for r in RANGES], "series_style": series_style(),
            "refresh_seconds": REFRESH_SECONDS,
            "throughput_legend": legend(THROUGHPUT), "latency_legend": legend(LATENCY),
        })
