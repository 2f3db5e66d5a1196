"""Dead letters: what failed, for which group, why; replay or discard them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from sqlqueue.admin.display import EpochMsDateRangeFilter, from_epoch_ms
from sqlqueue.admin.messages import JsonColumns, ReadOnlyAdmin
from sqlqueue.models import DeadLetter
from sqlqueue.operations.dead_letters import (
    NotADeadLetter,
    discard_dead_letter,
    replay_dead_letter,
)


@admin.register(DeadLetter)
class DeadLetterAdmin(JsonColumns, ReadOnlyAdmin):
    list_display = ("offset", "consumer_group", "original_topic", "partition_key",
                    "message_id", "failure_count", "failed", "error_summary")
    list_filter = ("consumer_group", "original_topic", ("failed_at", EpochMsDateRangeFilter))
    search_fields = ("=id", "=partition_key")
    show_full_result_count = False
    ordering = ("-offset",)
    actions = ("replay", "discard")
    fields = ("offset", "consumer_group", "original_topic", "partition_key", "message_id",
              "failure_count", "failed", "traceback", "payload_json", "metadata_json")
    readonly_fields = fields

    # -- columns ---------------------------------------------------------------------------
    @admin.display(description="message id")
    def message_id(self, obj: DeadLetter) -> str:
        detail = obj.failure_detail if isinstance(obj.failure_detail, dict) else {}
        return str(detail.get("id", obj.id))

    @admin.display(description="failed", ordering="failed_at")
    def failed(self, obj: DeadLetter) -> dt.datetime | None:
        return from_epoch_ms(obj.failed_at)

    @admin.display(description="last error")
    def error_summary(self, obj: DeadLetter) -> str:
        lines = obj.last_error.strip().splitlines()
        return lines[-1][:120] if lines else ""

    @admin.display(description="last error")
    def traceback(self, obj: DeadLetter) -> SafeString:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.last_error)


    # -- permissions for the actions ---------------------------------------------------------
    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.replay_deadletter")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.discard_deadletter")

    # -- actions -------------------------------------------------------------------------
    @admin.action(description="Replay to their consumer group", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        done, gone = self._each(queryset, replay_dead_letter)
        self._report(request, "Replayed", done, gone)

    @admin.action(description="Discard for good", permissions=["discard"])
    def discard(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        if request.POST.get("confirmed") != "yes":
            return TemplateResponse(request, "admin/sqlqueue/confirm_discard.html", {
                **self.admin_site.each_context(request),
                "title": "Discard dead letters?",
                "dead_letters": queryset[:100],
                "count": queryset.count(),
                "offsets": list(queryset.values_list("offset", flat=True)),
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "opts": self.model._meta,
            })
        done, gone = self._each(queryset, discard_dead_letter)
        self._report(request, "Discarded", done, gone)
        return None

    @staticmethod
    def _each(queryset: QuerySet[DeadLetter], operation: Any) -> tuple[int, int]:
        done = gone = 0
        for offset in queryset.values_list("offset", flat=True):
            try:
                operation(offset)  # one transaction each, shared with the CLI
                done += 1
            except NotADeadLetter:
                gone += 1
        return done, gone

    def _report(self, request: HttpRequest, verb: str, done: int, gone: int) -> None:
        self.message_user(request, f"{verb} {done} dead letter(s).", messages.SUCCESS)
        if gone:
            self.message_user(request, f"{gone} had been replayed or discarded already.",
                              messages.WARNING)
