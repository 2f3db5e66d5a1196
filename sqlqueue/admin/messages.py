"""The message log, read-only: browse by topic and partition, filter by creation time."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import unquote

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.admin.bounded import (
    BoundedPaginator,
    CreatedRangeFilter,
    choices_filter,
    request_topics,
)
from sqlqueue.admin.display import DateRangeFilters, from_epoch_ms, pretty_json
from sqlqueue.admin.operator_pages import WithoutSchemaHelp
from sqlqueue.conf import get_settings
from sqlqueue.models import QueueMessage
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.log_browse import (
    SEARCH_CAP,
    dead_letter_topics,
    log_topics,
    search_offsets,
)

#: the end of a stored traceback shown on a message's page (its last lines say why)
MAX_ERROR_CHARS = 4_000


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Data is never edited through forms: only viewed, and changed by actions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


#: set on a request whose changelist is made for its queryset only (its filters and
#: search, as "Replay all matching" needs): no count, no page of results
QUERYSET_ONLY = "_sqlqueue_changelist_queryset_only"


class BoundedChangeList(ChangeList):
    """Django's change list, with the keyset step of a bounded page: ``older_url`` shows
    the rows below the page's last offset (the filters kept), ``newest_url`` goes back
    to the top (``sqlqueue.admin.bounded``)."""

    older_url: str = ""
    newest_url: str = ""
    count_text: str = ""

    def get_results(self, request: HttpRequest) -> None:
        if getattr(request, QUERYSET_ONLY, False):
            return  # a page that wants the filtered queryset, not a page of it
        super().get_results(request)
        shown = [row.offset for row in self.result_list]  # evaluated once, for the page too
        paginator = self.paginator
        capped = bool(getattr(paginator, "capped", False))
        name = self.opts.verbose_name if self.result_count == 1 else self.opts.verbose_name_plural
        self.count_text = (
            f"more than {paginator.cap:,} {self.opts.verbose_name_plural} (counting stops there)"
            if capped else f"{self.result_count} {name}")
        below = request.GET.get("offset__lt")
        if below:
            self.count_text += f", below offset {below}"
            self.newest_url = self.get_query_string(remove=["offset__lt", PAGE_VAR])
        more = capped or self.page_num < paginator.num_pages
        # A step below the page's last offset follows the default order (newest first)
        # only; sorted by another column, the page links are the way.
        if shown and more and ORDER_VAR not in request.GET:
            self.older_url = self.get_query_string({"offset__lt": min(shown)}, [PAGE_VAR])


class BoundedListAdmin(ReadOnlyAdmin):
    """A changelist over the log that stays fast whatever its size: counts capped at
    ``COUNT_CAP``, no facet counts, the keyset "older" step, and a search made of index
    lookups in ``search_topics`` (``sqlqueue.operations.log_browse``)."""

    paginator = BoundedPaginator
    show_full_result_count = False  # no COUNT(*) over the whole log on every page
    show_facets = admin.ShowFacets.NEVER  # facet counts would count the log per choice
    search_fields = ("=id", "=partition_key")  # the search box; see get_search_results
    search_help_text = (
        f"Finds an offset (a number), a partition key or a message id, exactly, in each "
        f"topic (or the filtered one), by index; the newest {SEARCH_CAP:,} matches. The "
        f"list counts up to {COUNT_CAP:,} rows; go further with \"older\".")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BoundedChangeList

    def search_topics(self, request: HttpRequest, alias: str) -> list[str]:
        raise NotImplementedError

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        if not search_term.strip():
            return queryset, False
        alias = queryset.db
        offsets = search_offsets(search_term, self.search_topics(request, alias), alias)
        return queryset.filter(offset__in=offsets), False


class JsonColumns:
    """Payload and metadata as escaped, truncated pretty JSON (messages, dead letters)."""

    @admin.display(description="payload")
    def payload_json(self, obj: QueueMessage) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="metadata")
    def metadata_json(self, obj: QueueMessage) -> SafeString:
        return pretty_json(obj.metadata)


@admin.register(QueueMessage)
class QueueMessageAdmin(WithoutSchemaHelp, DateRangeFilters, JsonColumns, BoundedListAdmin):
    list_display = ("offset", "topic", "partition_key", "id", "priority", "created",
                    "deliver_after_time")
    # Topics by one index seek each, not a DISTINCT over the log (sqlqueue.admin.bounded).
    list_filter = (choices_filter("topic", "topic",
                                  lambda request, alias: log_topics(
                                      alias, request_topics(request, alias))),
                   ("created_at", CreatedRangeFilter))
    ordering = ("-offset",)
    change_list_template = "admin/sqlqueue/queuemessage/change_list.html"
    fields = ("offset", "topic", "partition_key", "id", "priority", "created",
              "published", "deliver_after_time", "consumer_group", "delivery",
              "metadata_json", "payload_json")
    readonly_fields = fields
    actions = ("cancel_for_group",)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("sqlqueue.cancel_message"))

    @admin.action(description="Cancel for a consumer group", permissions=["cancel"])
    def cancel_for_group(self, request: HttpRequest, queryset: Any) -> Any:
        """Asks which group (of the selected messages' topics) first, then cancels."""
        from sqlqueue.operations.cancel import cancel_messages
        from sqlqueue.operations.lag import known_subscriptions

        selected = list(queryset.values_list("offset", "topic"))
        topics = sorted({topic for _, topic in selected})
        choices = [(g, t) for g, t in known_subscriptions() if t in topics]
        chosen = request.POST.get("subscription", "")
        if request.POST.get("confirmed") == "yes" and chosen:
            group, _, topic = (unquote(part) for part in chosen.partition("/"))
            if (group, topic) not in choices:
                self.message_user(request, f"No consumer group {group!r} on {topic!r}.",
                                  messages.ERROR)
                return None
            result = cancel_messages(group, topic, offsets=[o for o, t in selected
                                                            if t == topic])
            self.message_user(request, result.describe(group, topic), messages.SUCCESS)
            return None
        return TemplateResponse(request, "admin/sqlqueue/confirm_cancel.html", {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": "Cancel messages?", "count": len(selected),
            "offsets": [o for o, _ in selected], "choices": choices,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        })

    def get_queryset(self, request: HttpRequest) -> Any:
        # Dead letters have their own page. Left out by topic (the dead-letter topics, by
        # index seeks), not by their columns: a count of one topic then reads only the
        # (topic, partition_key, offset) index, not each row for two unindexed columns.
        rows = super().get_queryset(request)
        return rows.exclude(topic__in=dead_letter_topics(
            rows.db, request_topics(request, rows.db)))

    def search_topics(self, request: HttpRequest, alias: str) -> list[str]:
        topic = request.GET.get("topic")
        return [topic] if topic else log_topics(alias, request_topics(request, alias))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        return super().changelist_view(request, {**(extra_context or {}),
                                                 "retention_note": retention_note()})

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.created_at)

    @admin.display(description="published")
    def published(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.published_at)

    @admin.display(description="delivery by group")
    def delivery(self, obj: QueueMessage) -> SafeString:
        """Every known group of the topic: its state of this message (acked, retrying and
        when the next attempt is due, in flight, done, not started), attempts so far and,
        while it is retrying, the last error (why it is stuck, without the worker logs)."""
        from sqlqueue.operations.message_delivery import message_delivery

        rows = [format_html(
            '<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            '<td class="sqlqueue-last-error">{}</td></tr>',
            d.group, d.state, d.attempts or "-",
            from_epoch_ms(d.next_attempt_at) if d.next_attempt_at else "-",
            format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
                        d.last_error[-MAX_ERROR_CHARS:]) if d.last_error else "-")
            for d in message_delivery(obj)]
        if not rows:
            return format_html("<span>{}</span>", "no consumer group consumes this topic yet")
        return format_html(
            '<table id="sqlqueue-delivery"><thead><tr><th>group</th><th>state</th>'
            "<th>attempts</th><th>next attempt</th><th>last error</th></tr></thead>"
            "<tbody>{}</tbody></table>", format_html_join("", "{}", ((r,) for r in rows)))

    @admin.display(description="not before")
    def deliver_after_time(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.deliver_after)



def retention_note() -> str:
    """What the Messages page says about the messages it does not show (issue 53 F3): a
    busy queue with the default settings shows few, because garbage collection deletes
    what every group acked."""
    retention = get_settings().RETENTION
    if not retention:
        return ("Garbage collection (run by runconsumer) deletes a message once every consumer "
                "group of its topic has acked it: with SQLQUEUE[\"RETENTION\"] at 0, the default, "
                "a busy queue shows few messages here. To keep acked messages for a while, set "
                "SQLQUEUE[\"RETENTION\"], e.g. timedelta(days=7). Topics no group consumes, "
                "and dead letters, are kept.")
    return (f"Garbage collection (run by runconsumer) deletes a message "
            f"{_duration(retention)} after every consumer group of its topic has acked it "
            f"(SQLQUEUE[\"RETENTION\"]). Topics no group consumes, and dead letters, are kept.")


def _duration(seconds: float) -> str:
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"
