"""Several databases: ``SQLQUEUE["ROUTES"]`` sends a topic's messages to an alias, and
``runconsumer --database`` consumes that alias (SPEC §9, issue 15). The test alias
"routes" mirrors the default database, so the check is which connection ran the
statements."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

import sqlqueue
from sqlqueue import send_message, send_messages
from sqlqueue.conf import validate
from sqlqueue.models import PartitionOffset
from tests.integration.consuming_helpers import register
from tests.integration.test_admin import admin_client
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "routes"])
__all__ = ["admin_client", "register"]  # the fixtures
ROUTED = {"ROUTES": {"orders.*": "routes"}}


def inserts(queries: CaptureQueriesContext) -> int:
    """Messages written through that connection (a new MySQL connection also checks its
    character set first)."""
    return sum("INSERT INTO `queue_messages`" in q["sql"] or 'INSERT INTO "queue_messages"'
               in q["sql"] for q in queries.captured_queries)


def test_a_routed_topic_is_published_to_its_alias() -> None:
    with override_settings(SQLQUEUE=ROUTED), \
            CaptureQueriesContext(connections["routes"]) as routed, \
            CaptureQueriesContext(connections["default"]) as default:
        send_message("orders.created", {"n": 1}, partition_key="k")
        send_messages("orders.paid", [{"n": 2}])
        send_message("shop.viewed", {"n": 3})
    assert inserts(routed) == 2
    assert inserts(default) == 1  # shop.viewed: no route, SQLQUEUE["DATABASE"]


def test_using_wins_over_a_route() -> None:
    with override_settings(SQLQUEUE=ROUTED), \
            CaptureQueriesContext(connections["default"]) as default:
        send_message("orders.created", {}, using="default")
    assert inserts(default) == 1


def test_runconsumer_refuses_consumers_routed_elsewhere(register: Any) -> None:
    register("orders.created", "billing", lambda message: None)
    with override_settings(SQLQUEUE=ROUTED), pytest.raises(CommandError) as refused:
        call_command("runconsumer", "--group", "billing", "--until-empty", stdout=StringIO())
    assert "orders.created -> routes" in str(refused.value)
    assert "--database" in str(refused.value)


def test_runconsumer_consumes_the_alias_it_is_given(register: Any) -> None:
    handled: list[int] = []
    register("orders.created", "billing", lambda message: handled.append(message.offset))
    with override_settings(SQLQUEUE=ROUTED):
        sent = send_message("orders.created", {}, partition_key="k")
        with CaptureQueriesContext(connections["routes"]) as routed:
            call_command("runconsumer", "--group", "billing", "--database", "routes",
                         "--until-empty", stdout=StringIO())
    assert handled == [sent.offset]
    assert routed.captured_queries


def test_runconsumer_names_an_unknown_alias() -> None:
    with pytest.raises(CommandError) as refused:
        call_command("runconsumer", "--database", "nowhere", "--until-empty",
                     stdout=StringIO())
    assert "'nowhere' is not a database alias" in str(refused.value)


@pytest.mark.parametrize(("routes", "check_id"), [
    ("orders_db", "sqlqueue.E003"),
    ({"orders.*": ""}, "sqlqueue.E004"),
    ({"orders.*": "nowhere"}, "sqlqueue.E007"),
])
def test_bad_routes_are_check_errors(routes: Any, check_id: str) -> None:
    settings, problems = validate({"ROUTES": routes}, {"default": {}, "routes": {}})
    assert settings is None
    assert [p.id for p in problems] == [check_id]


def test_the_first_matching_route_wins() -> None:
    settings, _ = validate({"ROUTES": {"orders.refunds": "default", "orders.*": "routes"}},
                           {"default": {}, "routes": {}})
    assert settings is not None
    assert settings.alias_for("orders.refunds") == "default"
    assert settings.alias_for("orders.created") == "routes"
    assert settings.alias_for("shop.viewed") == "default"


def test_monitoring_reads_every_database_the_queue_lives_in(register: Any) -> None:
    """Metrics, ``queue health`` and ``queue status`` read SQLQUEUE["DATABASE"] and every
    alias a route names; each subscription says which. ("routes" mirrors the default
    database here, so the same subscription shows once per alias.)"""
    register("orders.created", "billing", lambda message: None)
    with override_settings(SQLQUEUE={**ROUTED, "METRICS_TOKEN": "t"}):
        sent = send_message("orders.created", {}, partition_key="k")
        PartitionOffset.objects.create(consumer_group="billing", topic="orders.created",
                                       partition_key="k", offset_acked=0, updated_at=1)
        with CaptureQueriesContext(connections["routes"]) as routed:
            samples = scrape(Client(), Authorization="Bearer t")
        assert routed.captured_queries
        for database in ("default", "routes"):
            assert value(samples, "sqlqueue_pending_messages", "billing", "orders.created",
                         database=database) == 1
        out = StringIO()
        with pytest.raises(SystemExit):  # STOP: nobody consumes
            call_command("queue", "health", "--json", stdout=out)
        report = json.loads(out.getvalue())
        assert {(s["database"], s["status"]) for s in report["subscriptions"]
                if s["group"] == "billing"} == {("default", "STOP"), ("routes", "STOP")}
        out = StringIO()
        call_command("queue", "status", "--group", "billing", stdout=out)
        assert [line.split()[-1] for line in out.getvalue().splitlines()[1:]] == [
            "default", "routes"]
    assert sent.offset


def test_repairs_go_to_the_database_of_the_topic(register: Any) -> None:
    register("orders.created", "billing", lambda message: None)
    with override_settings(SQLQUEUE=ROUTED):
        sent = send_message("orders.created", {}, partition_key="k")
        PartitionOffset.objects.create(consumer_group="billing", topic="orders.created",
                                       partition_key="k", offset_acked=sent.offset,
                                       updated_at=1)
        with CaptureQueriesContext(connections["routes"]) as routed:
            call_command("queue", "reset-position", "billing", "orders.created", "k",
                         "--from", str(sent.offset), "--yes", stdout=StringIO())
            call_command("queue", "pause", "--topic", "orders.created", stdout=StringIO())
    writes = [q["sql"] for q in routed.captured_queries
              if q["sql"].startswith(("UPDATE", "INSERT"))]
    assert any("queue_offsets" in sql for sql in writes), writes
    assert any("queue_flow_control" in sql for sql in writes), writes


def test_dead_letters_and_gc_cover_every_database(register: Any) -> None:
    def refuse(message: Any) -> None:
        raise sqlqueue.Reject("no")

    register("orders.created", "billing", refuse)
    with override_settings(SQLQUEUE=ROUTED):
        send_message("orders.created", {}, partition_key="k")
        call_command("runconsumer", "--group", "billing", "--database", "routes",
                     "--until-empty", stdout=StringIO())
        out = StringIO()
        call_command("queue", "dead-letters", "list", stdout=out)
        header, *listed = out.getvalue().splitlines()
        assert header.split()[-1] == "database"
        assert [line.rsplit(" ", 1)[-1] for line in listed] == ["default", "routes"]
        offset = listed[0].split()[0]
        with pytest.raises(CommandError, match="'nowhere' is not a database alias"):
            call_command("queue", "dead-letters", "replay", offset, "--database", "nowhere")
        with CaptureQueriesContext(connections["routes"]) as routed:
            call_command("queue", "dead-letters", "replay", offset, "--database", "routes",
                         stdout=StringIO())
            call_command("queue", "gc", stdout=StringIO())
    assert sum("DELETE" in q["sql"] for q in routed.captured_queries) >= 1


def test_the_admin_shows_every_database_and_reads_a_replica(register: Any,
                                                           admin_client: Client) -> None:
    """The lag overview lists the subscriptions of every database (with a database
    column); with READ_REPLICAS the pages read the replica ("routes" stands for it here),
    and a repair still writes to the database itself."""
    register("orders.created", "billing", lambda message: None)
    PartitionOffset.objects.create(consumer_group="billing", topic="orders.created",
                                   partition_key="k", offset_acked=0, updated_at=1)
    send_message("orders.created", {}, partition_key="k", using="default")
    with override_settings(SQLQUEUE=ROUTED):
        page = admin_client.get(reverse("admin:sqlqueue_consumerlag_changelist"))
        html = page.content.decode()
        assert "<th>database</th>" in html
        assert html.count("<td>routes</td>") >= 1 and html.count("<td>default</td>") >= 1
    replicated = {"READ_REPLICAS": {"default": "routes"}}
    url = (reverse("admin:sqlqueue_consumerlag_subscription")
           + "?group=billing&topic=orders.created")
    with override_settings(SQLQUEUE=replicated), \
            CaptureQueriesContext(connections["routes"]) as replica, \
            CaptureQueriesContext(connections["default"]) as primary:
        assert admin_client.get(url).status_code == 200
        assert admin_client.get(
            reverse("admin:sqlqueue_subscriberstatus_changelist")).status_code == 200
    assert any("queue_offsets" in q["sql"] for q in replica.captured_queries)
    assert not any("queue_offsets" in q["sql"] for q in primary.captured_queries)
    with override_settings(SQLQUEUE=replicated), \
            CaptureQueriesContext(connections["default"]) as primary:
        admin_client.post(reverse("admin:sqlqueue_consumerlag_pause")
                          + "?group=billing&topic=orders.created", {"do": "pause"})
    assert any(q["sql"].startswith("INSERT") and "queue_flow_control" in q["sql"]
               for q in primary.captured_queries)


def test_read_replicas_must_name_databases() -> None:
    _, problems = validate({"READ_REPLICAS": {"default": "nowhere"}},
                           {"default": {}, "routes": {}})
    assert [p.id for p in problems] == ["sqlqueue.E007"]
    _, problems = validate({"READ_REPLICAS": ["default"]}, {"default": {}})
    assert [p.id for p in problems] == ["sqlqueue.E003"]
