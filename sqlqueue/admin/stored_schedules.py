"""Schedules kept in the database (issue 42): created, edited, paused, resumed, run now
and deleted here; the setting's are listed read-only on the Schedules page beside them.
Every form is checked as ``manage.py check`` checks ``SQLQUEUE["SCHEDULES"]`` (cron by
croniter, the time zone by zoneinfo, the topic, payload or task). The task is chosen from
the registered ``@task``s, never typed: nothing a staff user types is imported (issue 53,
W1). Each refusal is shown beside the field it is about."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from sqlqueue.admin.schedules import may_see_stored, run_now_and_tell
from sqlqueue.models import StoredSchedule
from sqlqueue.operations.stored_schedules import (
    ScheduleError,
    check_stored_schedule,
    schedulable_tasks,
    schedule_definition,
    set_paused,
)

#: form field -> entry key, for the plain values (JSON ones are parsed)
PLAIN = ("every", "cron", "timezone", "topic", "partition_key", "priority", "task",
         "jitter", "catch_up")
JSON = ("payload", "args", "kwargs")
#: what the runner does with ``jitter`` (Schedule.jitter_for): not random, so that every
#: process publishes a tick at the same moment (issue 53, F11; docs/guides/schedules.md)
JITTER_HELP = ("Seconds, at most: each tick is published up to this much later, by an "
               "amount derived from the schedule and the tick (the same in every process).")


class StoredScheduleForm(forms.ModelForm):  # type: ignore[type-arg]
    every = forms.FloatField(required=False, help_text="Seconds between ticks (or a cron).")
    cron = forms.CharField(required=False, help_text="minute hour day-of-month month "
                           "day-of-week, e.g. 0 7 * * 1-5")
    timezone = forms.CharField(required=False, help_text="For cron: an IANA name such as "
                               "Europe/Paris (UTC if empty).")
    topic = forms.CharField(required=False, help_text="Publish a message to this topic ...")
    payload = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              help_text="... with this JSON payload.")
    partition_key = forms.CharField(required=False)
    priority = forms.IntegerField(required=False)
    task = forms.ChoiceField(required=False, help_text="... or enqueue this Django @task "
                             "(one of the project's registered tasks) ...")
    args = forms.CharField(required=False, help_text="... with these JSON args (a list) ...")
    kwargs = forms.CharField(required=False, help_text="... and kwargs (an object).")
    jitter = forms.FloatField(required=False, help_text=JITTER_HELP)
    catch_up = forms.IntegerField(required=False, help_text="Missed ticks published "
                                  "after an outage (1 if empty).")

    class Meta:
        model = StoredSchedule
        fields = ("name", "paused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        entry = self.instance.entry if isinstance(self.instance.entry, dict) else {}
        for key in PLAIN:
            self.initial.setdefault(key, entry.get(key))
        for key in JSON:
            if key in entry:
                self.initial.setdefault(key, json.dumps(entry[key]))
        if self.instance.pk:
            self.fields["name"].disabled = True  # its row of ticks is keyed by it
        task_field = self.fields["task"]
        assert isinstance(task_field, forms.ChoiceField)
        task_field.choices = self._task_choices(entry.get("task"))

    @staticmethod
    def _task_choices(current: Any) -> list[tuple[str, str]]:
        """The registered tasks; a stored one that is not (any more) stays selectable
        under a warning label, so that the form shows what the row holds, and saving it
        says why it is refused."""
        tasks = schedulable_tasks()
        choices = [("", "---------"), *((path, path) for path in tasks)]
        if isinstance(current, str) and current and current not in tasks:
            choices.append((current, f"{current} (not a registered task)"))
        return choices

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if any(key in self.errors for key in (*PLAIN, *JSON)):
            return data  # a field's own error first (a missing value is not the point)
        entry: dict[str, Any] = {key: data[key] for key in PLAIN
                                 if data.get(key) not in (None, "")}
        for key in JSON:
            if data.get(key) not in (None, ""):
                try:
                    entry[key] = json.loads(data[key])
                except ValueError as exc:
                    self.add_error(key, f"Not JSON: {exc}.")
                    return data
                except RecursionError:
                    self.add_error(key, "Nested too deep: lists and objects inside each "
                                        "other, too many levels for JSON a message carries.")
                    return data
        if (isinstance(entry.get("every"), float) and entry["every"].is_integer()
                and abs(entry["every"]) < 1e15):  # 60.0 is stored as 60; 1e308 stays a float
            entry["every"] = int(entry["every"])
        try:
            check_stored_schedule(data.get("name") or self.instance.name, entry)
        except ScheduleError as error:
            field = error.key if error.key in self.fields else None
            self.add_error(field, f"{error} ({error.check_id})")
            return data
        self.instance.entry = entry
        return data


@admin.register(StoredSchedule)
class StoredScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = StoredScheduleForm
    list_display = ("name", "timing", "target", "state", "changed_at", "changed_by")
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause", "resume", "run_now")
    readonly_fields = ("overview",)
    fieldsets = (
        (None, {"fields": ("name", "paused", "overview")}),
        ("When", {"fields": ("every", "cron", "timezone", "jitter", "catch_up")}),
        ("What", {"fields": ("topic", "payload", "partition_key", "priority", "task",
                             "args", "kwargs")}),
    )

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Not an entry of its own in the admin's index: the Schedules page lists these
        with their ticks (issue 53, F10); this list stays at its address for searching
        and bulk actions, linked from there."""
        return False

    def response_post_save_add(self, request: HttpRequest, obj: StoredSchedule) -> Any:
        return self._to_schedules(request) or super().response_post_save_add(request, obj)

    def response_post_save_change(self, request: HttpRequest, obj: StoredSchedule) -> Any:
        return self._to_schedules(request) or super().response_post_save_change(request, obj)

    def _to_schedules(self, request: HttpRequest) -> HttpResponseRedirect | None:
        """After a save, the Schedules page: its next tick shows the edit took effect."""
        if not may_see_stored(request):
            return None
        return HttpResponseRedirect(reverse("admin:sqlqueue_schedulestate_changelist",
                                            current_app=self.admin_site.name))

    def save_model(self, request: HttpRequest, obj: StoredSchedule, form: Any,
                   change: bool) -> None:
        obj.changed_by = request.user.get_username()
        super().save_model(request, obj, form, change)

    @admin.display(description="timing")
    def timing(self, obj: StoredSchedule) -> str:
        return _parsed(obj) or "(not usable)"

    @admin.display(description="publishes")
    def target(self, obj: StoredSchedule) -> str:
        entry = obj.entry if isinstance(obj.entry, dict) else {}
        return f"task {entry['task']}" if "task" in entry else f"topic {entry.get('topic')}"

    @admin.display(description="state", ordering="paused")
    def state(self, obj: StoredSchedule) -> str:
        return "paused" if obj.paused else "active"

    @admin.display(description="ticks")
    def overview(self, obj: StoredSchedule) -> SafeString:
        url = reverse("admin:sqlqueue_schedulestate_changelist",
                      current_app=self.admin_site.name)
        return format_html('Next and last tick, and each group\'s outcome: <a href="{}">'
                           "Schedules</a> (the setting's schedules are listed there too, "
                           "read-only).", url)

    # -- actions -------------------------------------------------------------------------
    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sqlqueue.run_schedule")

    @admin.action(description="Pause (publish nothing until resumed)",
                  permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[StoredSchedule]) -> None:
        changed = set_paused(queryset.values_list("name", flat=True), True,
                             by=request.user.get_username())
        self.message_user(request, f"Paused {changed} schedule(s).", messages.SUCCESS)

    @admin.action(description="Resume (from now: missed ticks are not published)",
                  permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[StoredSchedule]) -> None:
        changed = set_paused(queryset.values_list("name", flat=True), False,
                             by=request.user.get_username())
        self.message_user(request, f"Resumed {changed} schedule(s).", messages.SUCCESS)

    @admin.action(description="Run now (publish one tick now)", permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[StoredSchedule]) -> None:
        for name in queryset.values_list("name", flat=True):
            run_now_and_tell(self, request, name)


def _parsed(obj: StoredSchedule) -> str:
    return schedule_definition(obj.name, obj.entry)
