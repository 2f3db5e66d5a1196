"""Our custom admin pages write the breadcrumbs of the Django that renders them: the same
structure as a stock admin page of that Django (Django 6 an ``<ol>`` of ``<li>``, Django
5.2 a ``<div>`` of links separated by ``&rsaquo;``). Each Django styles only its own markup, so
a page that copies the other's shows an unstyled list (issue 37). Runs on whichever Django
is installed."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import sqlqueue
from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.models import DeadLetter
from tests.integration.consuming_helpers import drain, register
from tests.integration.test_admin import admin_client
from tests.integration.test_retire_group import a_group_that_left

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]
SEPARATOR = html.unescape("&rsaquo;")
BREADCRUMBS = re.compile(r'<(ol|div) class="breadcrumbs">.*?</\1>', re.S)


class Skeleton(HTMLParser):
    """The breadcrumbs' tags and attribute names in order, each text reduced to ``sep``
    (an ``&rsaquo;`` separator) and ``text``: what the admin's stylesheet keys on,
    without the words."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = sorted(f"{n}={v}" if n in ("class", "aria-current") else n for n, v in attrs)
        self.parts.append(f"<{tag} {' '.join(names)}>")

    def handle_endtag(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        for piece in re.split(f"({SEPARATOR})", html.unescape(data)):
            if piece.strip():
                self.parts.append("sep" if piece == SEPARATOR else "text")


def skeleton(page: Any) -> list[str]:
    assert page.status_code == 200, page.status_code
    found = BREADCRUMBS.findall(page.content.decode())
    match = BREADCRUMBS.search(page.content.decode())
    assert len(found) == 1 and match, "one breadcrumbs element per page"
    parser = Skeleton()
    parser.feed(match.group(0))
    return parser.parts


def test_custom_pages_have_the_stock_breadcrumbs_of_this_django(
        admin_client: Client, register: Any) -> None:
    a_group_that_left(register)  # "gone" on "t", which may be retired
    register("orders", "g", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")))
    sent = send_messages("orders", [OutgoingMessage(n, partition_key="k") for n in range(2)])
    drain(["g"])
    dead = DeadLetter.objects.filter(consumer_group="g").order_by("offset").first()
    assert dead is not None
    message = send_message("orders", 9, partition_key="k")

    # Stock pages of this Django, of the same depth as ours: a model's list (Home > app >
    # list), an object (Home > app > list > object) and its history (one more).
    stock_list = skeleton(admin_client.get(reverse("admin:sqlqueue_deadletter_changelist")))
    stock_object = skeleton(admin_client.get(
        reverse("admin:sqlqueue_queuemessage_change", args=[message.offset])))
    stock_history = skeleton(admin_client.get(
        reverse("admin:sqlqueue_deadletter_history", args=[dead.offset])))
    assert stock_list != stock_object != stock_history

    lists = {
        "lag overview": admin_client.get(reverse("admin:sqlqueue_consumerlag_changelist")),
        "subscribers": admin_client.get(reverse("admin:sqlqueue_subscriberstatus_changelist")),
        "schedules": admin_client.get(reverse("admin:sqlqueue_schedulestate_changelist")),
    }
    subscription = "?group=g&topic=orders"
    pages = {
        "subscription": admin_client.get(
            reverse("admin:sqlqueue_consumerlag_subscription") + subscription),
        "retry now": admin_client.get(
            reverse("admin:sqlqueue_consumerlag_retry_now") + subscription + "&partition=k"),
        "reset position": admin_client.get(
            reverse("admin:sqlqueue_consumerlag_reset_position") + subscription + "&partition=k"),
        "retire": admin_client.get(
            reverse("admin:sqlqueue_consumerlag_retire") + "?group=gone&topic=t"),
        "replay matching": admin_client.get(
            reverse("admin:sqlqueue_deadletter_replay_matching") + "?consumer_group=g"),
        "discard": admin_client.post(reverse("admin:sqlqueue_deadletter_changelist"), {
            "action": "discard", "_selected_action": [dead.offset]}),
        "cancel": admin_client.post(reverse("admin:sqlqueue_queuemessage_changelist"), {
            "action": "cancel_for_group", "_selected_action": [sent[1].offset]}),
    }
    objects = {
        "replay one": admin_client.get(
            reverse("admin:sqlqueue_deadletter_replay_one", args=[dead.offset])),
    }
    for name, page in lists.items():
        assert skeleton(page) == stock_list, name
    for name, page in pages.items():
        assert skeleton(page) == stock_object, name
    for name, page in objects.items():
        assert skeleton(page) == stock_history, name
