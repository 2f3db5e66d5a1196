"""The message log, read-only: browse by topic and partition, filter by creation time."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import unquote

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.admin.display import (
    DateRangeFilters,
    EpochMsDateRangeFilter,
    from_epoch_ms,
    pretty_json,
)
from sqlqueue.models import IS_DEAD_LETTER, QueueMessage

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


class JsonColumns:
    """Payload and metadata as escaped, truncated pretty JSON (messages, dead letters)."""

    @admin.display(description="payload")
    def payload_json(self, obj: QueueMessage) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="metadata")
    def metadata_json(self, obj: QueueMessage) -> SafeString:
        return pretty_json(obj.metadata)


@admin.register(QueueMessage)
class QueueMessageAdmin(DateRangeFilters, JsonColumns, ReadOnlyAdmin):
    list_display = ("offset", "topic", "partition_key", "id", "priority", "created",
                    "deliver_after_time")
    list_filter = ("topic", ("created_at", EpochMsDateRangeFilter))
    search_fields = ("=id", "=partition_key")
    show_full_result_count = False  # no COUNT(*) over the whole log on every page
    ordering = ("-offset",)
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
        # Dead letters have their own page.
        return super().get_queryset(request).exclude(IS_DEAD_LETTER)

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

