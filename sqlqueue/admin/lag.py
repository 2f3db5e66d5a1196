"""The lag dashboard: every (group, topic) at a glance, one page per subscription with its
partitions, and the repairs made from there (retry now, reset a position)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from sqlqueue.admin.charts import pending_columns, pending_labels, status_strip
from sqlqueue.admin.messages import ReadOnlyAdmin
from sqlqueue.admin.pages import REFRESH_SECONDS
from sqlqueue.conf import get_settings
from sqlqueue.models import ConsumerLag
from sqlqueue.operations import flow
from sqlqueue.operations import lag as lag_rules
from sqlqueue.operations.lag import group_lag, known_subscriptions
from sqlqueue.operations.lag_shapes import SEVERITY
from sqlqueue.operations.positions import InvalidPosition, reset_position, retry_now
from sqlqueue.operations.retire import CannotRetire, may_retire, retire_group
from sqlqueue.operations.unconsumed import unconsumed_topics

#: partitions listed on a subscription's page before "show all" (worst first)
PARTITION_ROWS = 200
#: subscriptions on a page of the lag overview (worst first): 1,500 rows of status strips
#: took 1-2 s to render (issue 52)
OVERVIEW_ROWS = 200


def _alias(topic: str) -> str:
    """The database a topic's state lives in (``SQLQUEUE["ROUTES"]``): repairs write
    there, and their confirmation pages read it."""
    return get_settings().alias_for(topic)


def _read_alias(topic: str) -> str:
    """Where the pages read that database: its replica if ``READ_REPLICAS`` names one."""
    return get_settings().read_alias(_alias(topic))


def _page_number(request: HttpRequest) -> int:
    try:
        return int(request.GET.get("page", "1"))
    except ValueError:
        return 1


def _status_totals(subscriptions: list[tuple[str, Any]]) -> list[tuple[str, int]]:
    """(status, subscriptions in it), worst first: every page of the overview says how
    many subscriptions are in each status, not only those it lists."""
    totals: dict[str, int] = {}
    for _, lag in subscriptions:
        totals[lag.status] = totals.get(lag.status, 0) + 1
    return sorted(totals.items(), key=lambda s_n: -SEVERITY[s_n[0]])


class ResetPositionForm(forms.Form):
    mode = forms.ChoiceField(choices=[
        ("from_offset", "Deliver again from offset"),
        ("to_head", "Skip to the head (drop everything pending)"),
    ], widget=forms.RadioSelect, initial="from_offset")
    offset = forms.IntegerField(min_value=1, required=False,
                                help_text="Every stored message with this offset or a "
                                          "higher one is delivered (again).")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("mode") == "from_offset" and data.get("offset") is None:
            self.add_error("offset", "Give the offset to deliver again from.")
        return data


@admin.register(ConsumerLag)
class ConsumerLagAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", wrap(self.overview_view), name=f"{name}_changelist"),
            path("subscription/", wrap(self.subscription_view), name=f"{name}_subscription"),
            path("retry-now/", wrap(self.retry_now_view), name=f"{name}_retry_now"),
            path("reset-position/", wrap(self.reset_position_view),
                 name=f"{name}_reset_position"),
            path("pause/", wrap(self.pause_view), name=f"{name}_pause"),
            path("retire/", wrap(self.retire_view), name=f"{name}_retire"),
        ]

    # -- pages ------------------------------------------------------------------------------
    def overview_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        conf = get_settings()
        # Every database the queue lives in, each read where READ_REPLICAS says.
        subscriptions = [(alias, g) for alias in conf.databases
                         for g in lag_rules.lag_overview(conf.read_alias(alias))]
        subscriptions.sort(key=lambda a_g: (-SEVERITY[a_g[1].status], a_g[1].group,
                                            a_g[1].topic, a_g[0]))
        pages = max(1, -(-len(subscriptions) // OVERVIEW_ROWS))
        page = min(max(_page_number(request), 1), pages)
        shown = subscriptions[(page - 1) * OVERVIEW_ROWS:page * OVERVIEW_ROWS]
        rows = [{"lag": g, "strip": status_strip(g.partitions), "database": alias,
                 "url": self._subscription_url(g.group, g.topic)} for alias, g in shown]
        return self._render(request, "admin/sqlqueue/lag_overview.html", {
            "title": "Consumer lag",
            "rows": rows,
            "page": page, "pages": pages, "subscriptions": len(subscriptions),
            "first_row": (page - 1) * OVERVIEW_ROWS + 1,
            "last_row": (page - 1) * OVERVIEW_ROWS + len(shown),
            "previous_url": f"?page={page - 1}" if page > 1 else "",
            "next_url": f"?page={page + 1}" if page < pages else "",
            "statuses": _status_totals(subscriptions),
            "unconsumed": [(alias, topic) for alias in conf.databases
                           for topic in unconsumed_topics(conf.read_alias(alias))],
            "several_databases": len(conf.databases) > 1,
            "rules": lag_rules,
            "refresh_seconds": REFRESH_SECONDS,
        })

    def subscription_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        group, topic = self._subscription(request)
        lag = group_lag(group, topic, using=_read_alias(topic))
        worst_first = sorted(lag.partitions,
                             key=lambda p: (-SEVERITY[p.status], -(p.pending or 0),
                                            p.partition_key))
        show_all = request.GET.get("all") == "1"
        return self._render(request, "admin/sqlqueue/lag_subscription.html", {
            "title": f"{group} on {topic}",
            "lag": lag,
            "chart": pending_columns(lag.partitions),
            "chart_scale_and_keys": pending_labels(lag.partitions),
            "partitions": worst_first if show_all else worst_first[:PARTITION_ROWS],
            "hidden": 0 if show_all else max(0, len(worst_first) - PARTITION_ROWS),
            "all_url": "?" + urlencode({"group": group, "topic": topic, "all": "1"}),
            "may_retry": request.user.has_perm("sqlqueue.retry_now"),
            "may_reset": request.user.has_perm("sqlqueue.reset_position"),
            "retry_url": self._action_url("retry_now", group, topic),
            "reset_url": self._action_url("reset_position", group, topic),
            "may_pause": request.user.has_perm("sqlqueue.pause_subscription"),
            "pause_url": self._action_url("pause", group, topic),
            # Retiring is offered for a group nobody runs whose consumer left the code.
            "may_retire": request.user.has_perm("sqlqueue.retire_group")
            and may_retire(group, topic, _alias(topic), held=bool(lag.held)),
            "retire_url": self._action_url("retire", group, topic),
            "rules": lag_rules,
            "refresh_seconds": REFRESH_SECONDS,
        })

    # -- repairs ----------------------------------------------------------------------------
    def retry_now_view(self, request: HttpRequest) -> HttpResponse:
        self._require_perm(request, "sqlqueue.retry_now")
        group, topic = self._subscription(request)
        partition = request.GET.get("partition") or None
        lag = group_lag(group, topic, using=_alias(topic))
        if partition is not None and lag.partition(partition) is None:
            raise Http404(f"{group} on {topic} has no partition {partition!r}.")
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            count = retry_now(group, topic, partition, using=_alias(topic))
            where = f"partition {partition}" if partition else "every partition"
            self.message_user(request, f"{count} message(s) of {group} on {topic} "
                              f"({where}) will be delivered again now.", messages.SUCCESS)
            return HttpResponseRedirect(self._subscription_url(group, topic))
        retrying = (lag.partition(partition).retrying if partition  # type: ignore[union-attr]
                    else lag.retrying)
        return self._render(request, "admin/sqlqueue/confirm_retry_now.html", {
            "title": "Retry now?", "group": group, "topic": topic, "partition": partition,
            "retrying": retrying, "back_url": self._subscription_url(group, topic),
        })

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``pause`` or ``resume``: pause or resume this group on this topic."""
        self._require_perm(request, "sqlqueue.pause_subscription")
        group, topic = self._subscription(request)
        if request.method != "POST" or request.POST.get("do") not in ("pause", "resume"):
            return HttpResponseRedirect(self._subscription_url(group, topic))
        if request.POST["do"] == "pause":
            flow.pause(group, topic, by=f"admin:{request.user.get_username()}",
                       using=_alias(topic))
            self.message_user(request, f"Paused {group} on {topic}: running consumers start "
                              "nothing new within about a second.", messages.SUCCESS)
        else:
            flow.resume(group, topic, using=_alias(topic))
            still = flow.is_paused(group, topic, using=_alias(topic))
            self.message_user(request, f"Resumed {group} on {topic}." + (
                " It is still paused by a pause of the whole group or topic "
                "(manage.py queue pauses)." if still else ""),
                messages.WARNING if still else messages.SUCCESS)
        return HttpResponseRedirect(self._subscription_url(group, topic))

    def retire_view(self, request: HttpRequest) -> HttpResponse:
        self._require_perm(request, "sqlqueue.retire_group")
        group, topic = self._subscription(request)
        error = ""
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            try:
                retired = retire_group(group, topic, using=_alias(topic))
            except CannotRetire as exc:
                error = str(exc)
            else:
                self.message_user(request, retired.describe(), messages.SUCCESS)
                return HttpResponseRedirect(reverse(
                    f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                    current_app=self.admin_site.name))
        return self._render(request, "admin/sqlqueue/confirm_retire_group.html", {
            "title": f"Retire {group} on {topic}?", "group": group, "topic": topic,
            "lag": group_lag(group, topic, using=_alias(topic), count_pending=False),
            "error": error,
            "back_url": self._subscription_url(group, topic),
        })

    def reset_position_view(self, request: HttpRequest) -> HttpResponse:
        self._require_perm(request, "sqlqueue.reset_position")
        group, topic = self._subscription(request)
        key = request.GET.get("partition", "")
        partition = group_lag(group, topic, using=_alias(topic)).partition(key)
        if partition is None:
            raise Http404(f"{group} on {topic} has no partition {key!r}.")
        form = ResetPositionForm(request.POST if request.method == "POST" else None)
        confirming = False
        if request.method == "POST" and form.is_valid():
            deliver_from = (form.cleaned_data["offset"]
                            if form.cleaned_data["mode"] == "from_offset" else None)
            if request.POST.get("confirmed") == "yes":
                try:
                    moved = reset_position(group, topic, key, deliver_from=deliver_from,
                                           to_head=deliver_from is None, using=_alias(topic))
                except InvalidPosition as error:
                    form.add_error(None, str(error))
                else:
                    self.message_user(request, moved.describe(), messages.SUCCESS)
                    return HttpResponseRedirect(self._subscription_url(group, topic))
            else:
                confirming = True
        return self._render(request, "admin/sqlqueue/reset_position.html", {
            "title": f"Reset the position of {group} on {topic}/{key}",
            "group": group, "topic": topic, "partition": partition, "form": form,
            "confirming": confirming, "back_url": self._subscription_url(group, topic),
        })

    # -- helpers ----------------------------------------------------------------------------
    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _require_perm(self, request: HttpRequest, permission: str) -> None:
        self._require_view(request)
        if not request.user.has_perm(permission):
            raise PermissionDenied

    @staticmethod
    def _subscription(request: HttpRequest) -> tuple[str, str]:
        group, topic = request.GET.get("group", ""), request.GET.get("topic", "")
        if (group, topic) not in known_subscriptions(_read_alias(topic)):
            raise Http404(f"No consumer group {group!r} on topic {topic!r}.")
        return group, topic

    def _subscription_url(self, group: str, topic: str) -> str:
        return (reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_subscription",
                        current_app=self.admin_site.name)
                + "?" + urlencode({"group": group, "topic": topic}))

    def _action_url(self, action: str, group: str, topic: str) -> str:
        return (reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{action}",
                        current_app=self.admin_site.name)
                + "?" + urlencode({"group": group, "topic": topic}))

    def _render(self, request: HttpRequest, template: str,
                context: dict[str, Any]) -> TemplateResponse:
        return TemplateResponse(request, template, {
            **self.admin_site.each_context(request), "opts": self.opts, **context,
        })

