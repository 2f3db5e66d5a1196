"""Template filters of the sqlqueue admin pages."""

from __future__ import annotations

import django
from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from sqlqueue.admin.charts import STATUS_COLORS

register = template.Library()


@register.simple_tag
def admin_breadcrumbs_are_a_list() -> bool:
    """Whether this Django's admin writes its breadcrumbs as an ``<ol>`` of ``<li>``
    (Django 6) rather than a ``<div>`` of links separated by ``&rsaquo;`` (Django 5.2):
    our pages write the markup the running admin's stylesheet styles."""
    return django.VERSION >= (6, 0)


@register.filter
def age(seconds: float | None) -> str:
    """A duration the way an operator reads it: 4 s, 12 min, 3 h, 2 d."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} d"


@register.filter
def status_badge(status: str) -> SafeString:
    color = STATUS_COLORS.get(status, "#666")
    text = "#000" if status == "WARN" else "#fff"
    return format_html(
        '<span class="sqlqueue-status" style="background:{};color:{};padding:1px 6px;'
        'border-radius:3px;font-weight:bold">{}</span>', color, text, status)


@register.filter
def at_least(count: int, capped: bool) -> str:
    return f">={count}" if capped else str(count)


@register.filter
def first_of(keys: list[str], shown: int) -> str:
    """The first ``shown`` keys, then how many more."""
    text = ", ".join(keys[:shown])
    return f"{text} and {len(keys) - shown} more" if len(keys) > shown else text


@register.filter
def epoch_ms(value: int | None) -> str:
    """Epoch milliseconds as a UTC time to the second (``2026-11-23 10:00:00 UTC``)."""
    if value is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def last_line(text: str) -> str:
    """The last non-empty line of a traceback: the exception, which says why."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
