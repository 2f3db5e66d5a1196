"""Dead letters: what failed, for which group, why; replay or discard them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from sqlqueue.admin.bounded import (
    FailedRangeFilter,
    OffsetsFirstPaginator,
    choices_filter,
    request_topics,
)
from sqlqueue.admin.display import DateRangeFilters, from_epoch_ms
from sqlqueue.admin.messages import QUERYSET_ONLY, BoundedListAdmin, JsonColumns
from sqlqueue.admin.operator_pages import WithoutSchemaHelp
from sqlqueue.admin.pages import REFRESH_SECONDS, admin_url, confirmation_page
from sqlqueue.conf import get_settings
from sqlqueue.models import DeadLetter
from sqlqueue.operations.dead_letters import (
    REPLAY_AT_MOST,
    REPLAY_CHUNK,
    BulkResult,
    discard_dead_letters,
    replay_dead_letters,
    replay_matching,
)
from sqlqueue.operations.log_browse import (
    dead_letter_topics,
    group_dead_letter_topics,
    subscribed_groups,
    subscribed_topics,
)

#: What a dead letter's message was to an integration, as a link (or None: not one of
#: its own): the Tasks backend registers its task's result page
#: (``register_dead_letter_link``), so the admin imports no integration.
DeadLetterLink = Callable[[DeadLetter, str], SafeString | None]
_dead_letter_links: list[DeadLetterLink] = []


def register_dead_letter_link(link: DeadLetterLink) -> None:
    """Show ``link(dead_letter, admin_site_name)`` on a dead letter's page."""
    if link not in _dead_letter_links:
        _dead_letter_links.append(link)


#: What a dead letter's message asks for, in its integration's words ("task
#: app.tasks.send_invoice"), or None: not one of its own. The Tasks backend registers one
#: reading the task's path from the envelope (issue 53, F17: the list and the page name the
#: task, not only "tasks.default / default-5"), as its worker's ``describe_message`` does
#: for the failure log lines.
DeadLetterSubject = Callable[[DeadLetter], str | None]
_dead_letter_subjects: list[DeadLetterSubject] = []


def register_dead_letter_subject(describe: DeadLetterSubject) -> None:
    """Name what ``describe(dead_letter)`` says on the dead letters list and pages."""
    if describe not in _dead_letter_subjects:
        _dead_letter_subjects.append(describe)


def subject_of_dead_letter(dead: DeadLetter) -> str:
    """The first registered description of ``dead``; "" when none names it."""
    return next((subject for describe in _dead_letter_subjects
                 if (subject := describe(dead))), "")


#: dead letters one "replay all matching" request replays (set-based, REPLAY_CHUNK a
#: transaction, walked by the index); the rest on the next click, or from the command
#: line (manage.py queue dead-letters replay --all --at-most N), which shows progress
BULK_REPLAY_LIMIT = REPLAY_AT_MOST
#: dead letters the confirmation page reads to say how many match: an admin page answers
#: in a second on a log of millions (docs/benchmarks.md); the confirmed click walks the
#: index a step at a time instead of reading every offset it may replay
BULK_REPLAY_PREVIEW = 5_000


@admin.register(DeadLetter)
class DeadLetterAdmin(WithoutSchemaHelp, DateRangeFilters, JsonColumns, BoundedListAdmin):
    # Few, narrow columns: the "why" (last error) must be readable at 1366 px with the
    # navigation and the filters open; the message id is on the detail page (and searchable).
    list_display = ("offset", "where", "failures", "failed", "error_summary")
    # Groups and topics from the positions table, not a DISTINCT over the log; the rows
    # are read in the dead-letter topics only (get_queryset).
    list_filter = (choices_filter("consumer_group", "consumer group",
                                  lambda request, alias: subscribed_groups(alias),
                                  # In the dead-letter topics of the group's topics only
                                  # (read by idx_group_topic_offset).
                                  lambda group: {"consumer_group": group,
                                                 "topic__in": group_dead_letter_topics(
                                                     router.db_for_read(DeadLetter), group)}),
                   # A dead letter of topic T is a row of T<DLQ_SUFFIX>: filtered by that
                   # topic, the index answers (original_topic would read each row).
                   choices_filter("original_topic", "original topic",
                                  lambda request, alias: subscribed_topics(alias),
                                  lambda topic: {"topic": topic + get_settings().DLQ_SUFFIX}),
                   ("failed_at", FailedRangeFilter))
    # Newest first, by an expression of the offset: the primary key's order cannot serve it,
    # so the database sorts the dead-letter topics' index entries (as many as there are
    # dead letters) instead of walking the whole log backwards by offset until it meets
    # old dead letters (seconds on MariaDB under a backlog of millions); the page's rows
    # are then read by primary key (OffsetsFirstPaginator).
    ordering = ((F("offset") + 0).desc(),)
    paginator = OffsetsFirstPaginator
    actions = ("replay", "discard")
    fields = ("offset", "consumer_group", "original_topic", "partition_key", "subject",
              "message_id",
              "failure_count", "failed", "task_result", "traceback", "payload_json",
              "metadata_json")
    readonly_fields = fields
    change_list_template = "admin/sqlqueue/deadletter/change_list.html"
    change_form_template = "admin/sqlqueue/deadletter/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeadLetter]:
        """Every row of the dead-letter topics (``<topic><DLQ_SUFFIX>``: only dead
        letters are written there), read by the (topic, partition_key, offset) index
        alone; not by their two columns (``IS_DEAD_LETTER``, the model's manager), which
        would read each row."""
        alias = router.db_for_read(DeadLetter)
        rows = DeadLetter._base_manager.using(alias).filter(
            topic__in=dead_letter_topics(alias, request_topics(request, alias)))
        ordering = self.get_ordering(request)
        return rows.order_by(*ordering) if ordering else rows

    def search_topics(self, request: HttpRequest, alias: str) -> list[str]:
        return dead_letter_topics(alias, request_topics(request, alias))

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        # Before the default URLs: their "<path:object_id>/" would take these.
        return [path("replay-matching/", wrap(self.replay_matching_view),
                     name=f"{name}_replay_matching"),
                path("<path:object_id>/replay/", wrap(self.replay_one_view),
                     name=f"{name}_replay_one"),
                path("<path:object_id>/discard/", wrap(self.discard_one_view),
                     name=f"{name}_discard_one"),
                *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> HttpResponse:
        """The detail page, with Replay and Discard buttons for who may use them."""
        return super().change_view(request, object_id, form_url, {
            **(extra_context or {}),
            "may_replay": self.has_replay_permission(request),
            "may_discard": self.has_discard_permission(request),
            "replay_url": admin_url(self, "replay_one", object_id),
            "discard_url": admin_url(self, "discard_one", object_id),
        })

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_replay_matching",
                      current_app=self.admin_site.name)
        query = request.GET.urlencode()
        return super().changelist_view(request, {
            **(extra_context or {}),
            "replay_matching_url": f"{url}?{query}" if query else url,
            "may_replay": self.has_replay_permission(request),
            "refresh_seconds": REFRESH_SECONDS,
        })

    # -- columns ---------------------------------------------------------------------------
    @admin.display(description="message id")
    def message_id(self, obj: DeadLetter) -> str:
        detail = obj.failure_detail if isinstance(obj.failure_detail, dict) else {}
        return str(detail.get("id", obj.id))

    @admin.display(description="group / topic / partition", ordering="consumer_group")
    def where(self, obj: DeadLetter) -> SafeString:
        where = format_html("<strong>{}</strong><br>{} / {}", obj.consumer_group,
                            obj.original_topic, obj.partition_key)
        subject = subject_of_dead_letter(obj)
        if not subject:
            return where
        return format_html('{}<br><span class="sqlqueue-subject">{}</span>', where, subject)

    @admin.display(description="asks for")
    def subject(self, obj: DeadLetter) -> str:
        return subject_of_dead_letter(obj) or "-"

    @admin.display(description="attempts", ordering="failure_count")
    def failures(self, obj: DeadLetter) -> int:
        return obj.failure_count

    @admin.display(description="failed", ordering="failed_at")
    def failed(self, obj: DeadLetter) -> dt.datetime | None:
        return from_epoch_ms(obj.failed_at)

    @admin.display(description="last error")
    def error_summary(self, obj: DeadLetter) -> str:
        lines = obj.last_error.strip().splitlines()
        return lines[-1][:120] if lines else ""

    @admin.display(description="task result")
    def task_result(self, obj: DeadLetter) -> SafeString:
        """The result page of the task whose message this is (a Tasks backend's dead
        letter), where the task can be retried or discarded."""
        for link in _dead_letter_links:
            shown = link(obj, self.admin_site.name)
            if shown is not None:
                return shown
        return format_html("<span>{}</span>", "-")

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
        result = replay_dead_letters(queryset.values_list("offset", flat=True))
        self._report(request, "Replayed", result)

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
        result = discard_dead_letters(queryset.values_list("offset", flat=True))
        self._report(request, "Discarded", result)
        return None

    def replay_matching_view(self, request: HttpRequest) -> HttpResponse:
        """Replay every dead letter the changelist's current filters and search match."""
        if not (self.has_view_permission(request) and self.has_replay_permission(request)):
            raise PermissionDenied
        back = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                       current_app=self.admin_site.name)
        query = request.GET.urlencode()
        back = f"{back}?{query}" if query else back
        setattr(request, QUERYSET_ONLY, True)  # the matching rows, not a page of them
        try:
            matching = self.get_changelist_instance(request).get_queryset(request)
        except IncorrectLookupParameters:
            self.message_user(request, "Those filters are not valid.", messages.ERROR)
            return HttpResponseRedirect(back)
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            self._replay_matching(request, matching)
            return HttpResponseRedirect(back)
        # In the order of the (topic, partition_key, offset) index: partition by partition,
        # each oldest first, so the read stops after the preview's bound.
        offsets = list(matching.order_by("topic", "partition_key", "offset")
                       .values_list("offset", flat=True)[:BULK_REPLAY_PREVIEW + 1])
        more = len(offsets) > BULK_REPLAY_PREVIEW
        offsets = offsets[:BULK_REPLAY_PREVIEW]
        return TemplateResponse(request, "admin/sqlqueue/confirm_replay_matching.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Replay every matching dead letter?",
            "count": len(offsets),
            "more": more,  # more than ``count`` (the preview) match
            "limit": BULK_REPLAY_LIMIT,
            # the groups of the dead letters it would replay (by primary key), not a
            # DISTINCT over every match
            "groups": _groups_of(matching.db, offsets),
            "chunk": REPLAY_CHUNK,
            "filters": [(k, v) for k, v in request.GET.items()],
            "back_url": back,
        })

    def _replay_matching(self, request: HttpRequest, matching: QuerySet[DeadLetter]) -> None:
        """The confirmed click: at most ``BULK_REPLAY_LIMIT``, walked by the index of the
        dead-letter topics the filters leave (``replay_matching``: no statement reads
        more than ``REPLAY_CHUNK`` index entries), then how many were replayed and
        whether more match."""
        alias = matching.db
        topics = self.search_topics(request, alias)
        if group := request.GET.get("consumer_group"):
            topics = [t for t in group_dead_letter_topics(alias, group) if t in topics]
        if topic := request.GET.get("original_topic"):
            topics = [t for t in topics if t == topic + get_settings().DLQ_SUFFIX]
        transactions = [0]

        def count(done: int) -> None:
            transactions[0] += 1

        result = replay_matching(topics, matching, at_most=BULK_REPLAY_LIMIT, using=alias,
                                 on_progress=count)
        self.message_user(request, (
            f"Replayed {result.done} dead letter(s). In {transactions[0]} transaction(s) of "
            f"up to {REPLAY_CHUNK} (each one INSERT ... SELECT and one DELETE)."),
            messages.SUCCESS)
        if result.more:
            self.message_user(request, (
                f"More match: this click replays at most {BULK_REPLAY_LIMIT} (partition by "
                "partition, oldest first). Replay again for the next ones, or run "
                "`manage.py queue dead-letters replay --all`."), messages.WARNING)
        else:
            self.message_user(request, "No more dead letters match these filters.",
                              messages.INFO)

    def replay_one_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._one(request, object_id, "replay")

    def discard_one_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._one(request, object_id, "discard")

    def _one(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Replay or discard the dead letter of the detail page: GET asks, a POST that
        confirms does it (the same service functions as the list's actions)."""
        allowed = (self.has_replay_permission(request) if action == "replay"
                   else self.has_discard_permission(request))
        if not (self.has_view_permission(request) and allowed):
            raise PermissionDenied
        dead = self.get_object(request, object_id)
        if dead is None:
            self.message_user(request, f"Dead letter {object_id} was replayed or discarded "
                              "already.", messages.WARNING)
            return HttpResponseRedirect(admin_url(self, "changelist"))
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            if action == "replay":
                self._report(request, "Replayed", replay_dead_letters([dead.offset]))
            else:
                self._report(request, "Discarded", discard_dead_letters([dead.offset]))
            return HttpResponseRedirect(admin_url(self, "changelist"))
        return confirmation_page(
            self, request, "admin/sqlqueue/confirm_dead_letter.html", object_id,
            title=f"{action.capitalize()} dead letter {dead.offset}?", action=action,
            dead=dead, original=dead, summary=self.error_summary(dead))

    def _report(self, request: HttpRequest, verb: str, result: BulkResult) -> None:
        self.message_user(request, f"{verb} {result.done} dead letter(s).", messages.SUCCESS)
        if result.missing:
            self.message_user(request, f"{len(result.missing)} had been replayed or "
                              "discarded already.", messages.WARNING)


#: the groups a "replay all matching" confirmation names, at most
GROUPS_SHOWN = 20
#: offsets a query of ``_groups_of`` looks up (under SQLite's 999 parameters on Django 5.2)
GROUPS_BATCH = 900


def _groups_of(alias: str, offsets: list[int]) -> list[str]:
    """The groups of the dead letters at ``offsets`` (by primary key, ``GROUPS_BATCH`` at
    a time: within every database's limit on parameters), up to ``GROUPS_SHOWN``."""
    groups: set[str] = set()
    for first in range(0, len(offsets), GROUPS_BATCH):
        groups.update(DeadLetter.objects.using(alias)
                      .filter(offset__in=offsets[first:first + GROUPS_BATCH])
                      .values_list("consumer_group", flat=True))
        if len(groups) >= GROUPS_SHOWN:
            break
    return sorted(groups)[:GROUPS_SHOWN]
