"""The live overview (issue 42): per (group, topic), what the runners handled in each
minute of the last 15 minutes, 30 minutes, hour, 6 or 24 hours (``RANGES``), and handler duration
percentiles, from the per-minute rollup (``sqlqueue.operations.overview``); above them, the
runs of ``manage.py queue gc`` running or done lately (``sqlqueue.operations.gc``). The page
refreshes its numbers in place: a few lines of plain JavaScript fetch its fragment again
every ``REFRESH_SECONDS``."""

from __future__ import annotations

from datetime import UTC, datetime
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
from sqlqueue.operations.gc import CollectionReport, collection_runs
from sqlqueue.operations.overview import (
    WINDOW_MINUTES,
    SubscriptionActivity,
    activity,
    minutes_per_point,
)

#: the ranges the page offers, in minutes: at most a day, which the runners keep the
#: per-minute rows for (``sqlqueue.consuming.rollup.KEEP_MS``); over 6 h and 24 h a chart's
#: point sums several minutes (``minutes_per_point``)
RANGES = (15, 30, WINDOW_MINUTES, 6 * 60, 24 * 60)


def _range_name(minutes: int) -> str:
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def _card(alias: str, sub: SubscriptionActivity, minutes: int) -> dict[str, Any]:
    name = f"{sub.group} on {sub.topic}"
    span = "the last hour" if minutes == 60 else f"the last {_range_name(minutes)}"
    step = minutes_per_point(minutes)
    per = "per minute" if step == 1 else f"per minute (average of each {step} minutes)"
    last = sub.this_minute
    total = sub.total
    points = sub.minutes
    return {
        "sub": sub, "database": alias, "last": last,
        "rows": [(s.label, s.value(last), s.value(total),
                  (s.value(total) or 0) / minutes) for s in THROUGHPUT],
        "throughput": throughput_chart(
            points, f"{name}: messages {per} over {span}: "
            f"{total.published} published, {total.acked} acked, {total.retried} retried, "
            f"{total.dead_lettered} dead-lettered", step),
        "latency": latency_chart(
            points, f"{name}: handler duration p50 and p95 "
            f"{'per minute' if step == 1 else f'per {step} minutes'} over {span} "
            f"(whole range: p50 {_seconds(total.p50)}, p95 {_seconds(total.p95)})", step),
    }


def _collection(run: CollectionReport) -> dict[str, Any]:
    def at(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    return {"run": run, "started": at(run.started_ms), "updated": at(run.updated_ms),
            "state": {"running": "running", "finished": "finished",
                      "silent": "no word since"}[run.state],
            "rate": run.rows_per_second, "paced": run.share < 1}


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
            "collections": [_collection(run) for run in collection_runs()],
            "several_databases": len(conf.databases) > 1, "minutes": minutes,
            "range_name": _range_name(minutes), "step": minutes_per_point(minutes),
            "ranges": [(r, _range_name(r)) for r in RANGES], "series_style": series_style(),
            "refresh_seconds": REFRESH_SECONDS,
            "throughput_legend": legend(THROUGHPUT), "latency_legend": legend(LATENCY),
        })
