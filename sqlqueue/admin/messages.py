"""The message log, read-only: browse by topic and partition, filter by creation time."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString

from sqlqueue.admin.display import EpochMsDateRangeFilter, from_epoch_ms, pretty_json
from sqlqueue.models import IS_DEAD_LETTER, QueueMessage


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
class QueueMessageAdmin(JsonColumns, ReadOnlyAdmin):
    list_display = ("offset", "topic", "partition_key", "id", "priority", "created",
                    "deliver_after_time")
    list_filter = ("topic", ("created_at", EpochMsDateRangeFilter))
    search_fields = ("=id", "=partition_key")
    show_full_result_count = False  # no COUNT(*) over the whole log on every page
    ordering = ("-offset",)
    fields = ("offset", "topic", "partition_key", "id", "priority", "created",
              "published", "deliver_after_time", "consumer_group", "metadata_json",
              "payload_json")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> Any:
        # Dead letters have their own page.
        return super().get_queryset(request).exclude(IS_DEAD_LETTER)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.created_at)

    @admin.display(description="published")
    def published(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.published_at)

    @admin.display(description="not before")
    def deliver_after_time(self, obj: QueueMessage) -> dt.datetime | None:
        return from_epoch_ms(obj.deliver_after)

