"""The pieces that keep the Messages and Dead letters pages fast on a log of millions
(issue 52): a paginator that counts at most ``COUNT_CAP`` rows, list filters whose
choices come from the small tables, a creation-time filter that reads a range of
offsets, and a search made of index lookups (``sqlqueue.operations.log_browse``).

Nothing on these pages counts, sorts or de-duplicates the whole log. Deeper than the
counted rows, the pages go on by offset: "older" keeps the filters and shows the
messages below the last offset of the page (``offset__lt``), a keyset step that costs the
same at any depth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from sqlqueue.admin.display import EpochMsDateRangeFilter
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.log_browse import browse_topics, created_offset_range


def request_topics(request: HttpRequest, alias: str) -> list[str]:
    """The log's topics (one statement, one index seek each), read once per request: a
    page needs them for its queryset, its topic filter and its search."""
    kept: dict[str, list[str]] = request.__dict__.setdefault("_sqlqueue_topics", {})
    if alias not in kept:
        kept[alias] = browse_topics(alias)
    return kept[alias]


class BoundedPaginator(Paginator):  # type: ignore[type-arg]  # generic for stubs only
    """Counts at most ``COUNT_CAP + 1`` rows (``SELECT COUNT(*) FROM (... LIMIT n)``): a
    page shows "more than 10,000" instead of the log's size, and its page links stop
    there; a page number past them shows the last counted page."""

    cap = COUNT_CAP

    @cached_property
    def counted(self) -> int:
        """Matching rows, counted up to ``cap + 1``. Unordered: any cap + 1 rows will do,
        so the database may take the cheapest path to them (the list's ORDER BY could
        make it read and sort every match)."""
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]  # a queryset here
        return int(rows.order_by()[: self.cap + 1].count())

    @cached_property
    def count(self) -> int:
        """At most ``cap``: the pages are those of the first ``cap`` rows."""
        return min(self.counted, self.cap)

    @property
    def capped(self) -> bool:
        """More rows match than were counted."""
        return self.counted > self.cap

    def validate_number(self, number: Any) -> int:
        try:
            return int(super().validate_number(number))
        except EmptyPage:
            if self.capped:
                return int(self.num_pages)
            raise
        except PageNotAnInteger:
            raise


class OffsetsFirstPaginator(BoundedPaginator):
    """A page read in two steps: its offsets first (``SELECT offset ... LIMIT``, which the
    ``(topic, partition_key, offset)`` index answers alone when the filters are on its
    columns), then its rows by primary key; so the page's sort reads index entries, not
    the rows of every match."""

    def page(self, number: Any) -> Any:
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]  # a queryset here
        if rows.model._meta.pk.name != "offset":  # another page's list (an object's history)
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)
        offsets = list(rows.values_list("offset", flat=True)[bottom:top])
        return Page(rows.filter(offset__in=offsets), number, self)


#: choices a list filter offers at most (the selected one besides); the others are typed
#: into the filter's own field (a log of 1,500 topics, 1,000 groups)
LISTED_CHOICES = 100
#: parameters a typed choice does not keep: the page and the keyset step start afresh
_RESTARTED = ("p", "offset__lt")


def choices_filter(parameter: str, title: str, choices: Callable[[HttpRequest, str], list[str]],
                   lookup: Callable[[str], dict[str, Any]] | None = None,
                   ) -> type[admin.SimpleListFilter]:
    """A list filter on the column ``parameter`` whose choices come from
    ``choices(request, database alias)`` (small tables or index seeks), not from a DISTINCT over
    the log as Django's field filter would read them; the URL parameter stays the
    column's name (``?topic=...``). ``lookup(value)``: the filter to apply, if not
    ``{parameter: value}`` (one the index answers). At most ``LISTED_CHOICES`` are
    listed (and the selected one); with more, a field takes any other."""

    class ChoicesFilter(admin.SimpleListFilter):
        parameter_name = parameter
        template = "admin/sqlqueue/_bounded_filter.html"
        known = listed = 0
        kept_parameters: list[tuple[str, str]]  # set by lookups, per request

        @property
        def unlisted(self) -> bool:
            return self.known > self.listed

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            alias = model_admin.model.objects.db
            values = choices(request, alias)
            shown = values[:LISTED_CHOICES]
            selected = request.GET.get(parameter)
            if selected and selected not in shown:
                shown.append(selected)
            self.known, self.listed = len(values), min(len(values), LISTED_CHOICES)
            self.kept_parameters = [(k, str(v)) for k, v in request.GET.items()
                                    if k != parameter and k not in _RESTARTED]
            return [(value, value) for value in shown]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            if not value:
                return queryset
            return queryset.filter(**(lookup(value) if lookup else {parameter: value}))

    ChoicesFilter.title = title
    ChoicesFilter.__name__ = ChoicesFilter.__qualname__ = f"{parameter.title()}Filter"
    return ChoicesFilter


class CreatedRangeFilter(EpochMsDateRangeFilter):
    """The creation-time range, read as a range of offsets: the offsets of that time are
    found by binary search over the primary key (``created_at`` follows the offsets),
    then ``created_at`` is compared within them, so a range with nothing in it costs a
    few dozen seeks instead of a scan of the log."""

    #: False: only the end of the range bounds the offsets (``FailedRangeFilter``)
    lower_bound = True

    def _make_query_filter(self, request: Any, validated_data: dict[str, Any]) -> dict[str, Any]:
        bounds = super()._make_query_filter(request, validated_data)
        from sqlqueue.models import QueueMessage

        alias = router.db_for_read(QueueMessage)
        start = bounds.get(f"{self.field_path}__gte") if self.lower_bound else None
        end = bounds.get(f"{self.field_path}__lte")
        if start is None and end is None:
            return bounds
        offsets = created_offset_range(alias, start, end)
        if offsets is not None:
            bounds["offset__gte"] = offsets.first
            bounds["offset__lte"] = offsets.last
        return bounds


class FailedRangeFilter(CreatedRangeFilter):
    """The range of the time a dead letter failed: a dead letter is created when its
    message fails for good (``created_at``) and fails again only later (a redelivered
    message dead-lettered again updates ``failed_at`` in place), so every dead letter
    that failed by the end of the range was created by then: the end bounds its offset.
    The start does not (an old row may have failed again recently): the page reads the
    dead letters created before the end of the range."""

    lower_bound = False
