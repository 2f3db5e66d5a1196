"""A topic that has messages and no consumer group is visible (SPEC §10, issue 37): on
the admin's lag overview, in ``queue status`` and as a warning of ``queue health``
(still healthy). Dead-letter topics and consumed topics are not listed."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

import sqlqueue
from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.operations.unconsumed import stored_topics, unconsumed_topics
from tests.integration.consuming_helpers import drain, queue, register
from tests.integration.test_admin import admin_client

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]


def a_typo_and_a_consumed_topic(register: Any) -> None:
    """``orders.create`` (a typo: nobody consumes it) and ``orders.created``, consumed by
    a group that dead-letters one message (its dead-letter topic is not "unconsumed")."""
    register("orders.created", "billing",
             lambda m: (_ for _ in ()).throw(sqlqueue.Reject("no")) if m.payload == 0 else None)
    send_messages("orders.created", [OutgoingMessage(n, partition_key="k") for n in range(2)])
    send_messages("orders.create", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(3)])
    drain(["billing"])


def test_operations_list_topics_nobody_consumes(register: Any) -> None:
    a_typo_and_a_consumed_topic(register)
    assert stored_topics("default") == ["orders.create", "orders.created",
                                        "orders.created_dlq"]
    (row,) = unconsumed_topics()
    assert (row.topic, row.messages, row.capped) == ("orders.create", 3, False)


def test_status_health_and_admin_show_them(admin_client: Client, register: Any) -> None:
    a_typo_and_a_consumed_topic(register)
    status = queue("status")
    assert "Topics with messages and no consumer group" in status
    assert [line.split() for line in status.splitlines() if "orders.create " in line] == [
        ["WARN", "-", "orders.create", "3"]]

    out = io.StringIO()
    call_command("queue", "health", "--json", stdout=out)  # healthy: exits 0
    report = json.loads(out.getvalue())
    assert report["status"] == "healthy"
    assert report["warnings"] == [
        "topic 'orders.create' has 3 message(s) and no consumer group (kept until a group "
        "consumes it) on 'default'"]
    text = io.StringIO()
    call_command("queue", "health", stdout=text)
    assert "  warning: topic 'orders.create' has 3 message(s)" in text.getvalue()

    page = admin_client.get(reverse("admin:sqlqueue_consumerlag_changelist")).content.decode()
    section = page.split('id="sqlqueue-unconsumed"')[1]
    assert "<td>orders.create</td>" in section and "<td>3</td>" in section
    assert "orders.created_dlq" not in section
