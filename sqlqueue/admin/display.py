"""How the admin shows stored values: times from epoch ms, JSON escaped and truncated."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from rangefilter.filters import DateRangeFilter

MAX_SHOWN_CHARS = 20_000


def from_epoch_ms(value: int) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)


def pretty_json(value: Any) -> SafeString:
    """Pretty JSON in a <pre>, HTML-escaped, cut at MAX_SHOWN_CHARS characters."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return _pre(repr(raw[:MAX_SHOWN_CHARS]), len(raw) > MAX_SHOWN_CHARS)
    if value is None:
        return format_html("<span>{}</span>", "-")
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return _pre(text[:MAX_SHOWN_CHARS], len(text) > MAX_SHOWN_CHARS)


def _pre(text: str, cut: bool) -> SafeString:
    note = f"\n... (cut at {MAX_SHOWN_CHARS} characters)" if cut else ""
    return format_html('<pre style="white-space: pre-wrap">{}{}</pre>', text, note)


class EpochMsDateRangeFilter(DateRangeFilter):  # type: ignore[misc]  # untyped package
    """django-admin-rangefilter's date range, over an epoch-milliseconds column."""

    def _make_query_filter(self, request: Any, validated_data: dict[str, Any]) -> dict[str, Any]:
        bounds = super()._make_query_filter(request, validated_data)
        return {key: round(value.timestamp() * 1000) for key, value in bounds.items()}

    def get_timezone(self, _request: Any) -> Any:
        return timezone.get_current_timezone()
