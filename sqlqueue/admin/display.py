"""How the admin shows stored values: times from epoch ms, JSON escaped and truncated."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from django.apps import apps
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from rangefilter.filters import DateRangeFilter

#: the most characters the admin shows of one stored value (a payload, a traceback, a
#: task's result); more is cut, and the cut said
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
        except RecursionError:  # nested deeper than this stack decodes (stored before
            # MAX_JSON_DEPTH was enforced, or by another client): shown as stored
            text = raw[:MAX_SHOWN_CHARS * 4].decode("utf-8", "replace")
            return _pre(text[:MAX_SHOWN_CHARS], len(raw) > len(text[:MAX_SHOWN_CHARS]))
    if value is None:
        return format_html("<span>{}</span>", "-")
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except RecursionError:
        return _pre("(nested too deep to show here)", False)
    return _pre(text[:MAX_SHOWN_CHARS], len(text) > MAX_SHOWN_CHARS)


def _pre(text: str, cut: bool) -> SafeString:
    note = f"\n... (cut at {MAX_SHOWN_CHARS} characters)" if cut else ""
    return format_html('<pre style="white-space: pre-wrap">{}{}</pre>', text, note)


class EpochMsDateRangeFilter(DateRangeFilter):  # type: ignore[misc]  # untyped package
    """django-admin-rangefilter's date range, over an epoch-milliseconds column."""

    def _make_query_filter(self, request: Any, validated_data: dict[str, Any]) -> dict[str, Any]:
        bounds = super()._make_query_filter(request, validated_data)
        # Whole milliseconds, rounded down: the end of a day (23:59:59.999999) is its last
        # millisecond, not the first of the next day (round() made it so).
        return {key: math.floor(value.timestamp() * 1000) for key, value in bounds.items()}

    def get_timezone(self, _request: Any) -> Any:
        return timezone.get_current_timezone()


class DateRangeFilters:
    """ModelAdmin mixin: without ``"rangefilter"`` in INSTALLED_APPS its templates are
    missing and the page would crash (``TemplateDoesNotExist``); the page then shows its
    other filters only, and check sqlqueue.W003 says what is missing."""

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = super().get_list_filter(request)  # type: ignore[misc]
        if apps.is_installed("rangefilter"):
            return filters
        return [entry for entry in filters if not _is_date_range(entry)]


def _is_date_range(entry: Any) -> bool:
    return (isinstance(entry, tuple) and isinstance(entry[1], type)
            and issubclass(entry[1], DateRangeFilter))
