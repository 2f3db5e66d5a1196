"""The queue-state metrics view (``sqlqueue.urls`` metrics/, SPEC §9): metric names, labels
and values against known states, and who may read it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

import sqlqueue
from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.models import PartitionLease, SubscriberHeartbeat
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain, drain_until_watermarks, register
from tests.integration.test_admin import admin_client, staff_with

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]
METRICS = "sqlqueue:metrics"
TOKEN = "s3cret-scrape-token"


def scrape(client: Client, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]],
                                                 float]:
    """(sample name, sorted labels) -> value."""
    response = client.get(reverse(METRICS), headers=headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, group: str, topic: str,
          database: str = "default", **extra: str) -> float:
    labels = tuple(sorted({"group": group, "topic": topic, "database": database,
                           **extra}.items()))
    return samples[(name, labels)]


def now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def test_values_against_known_states(admin_client: Client, register: Any) -> None:
    # g on t: five messages over two partitions, nobody consuming -> STOP.
    register("t", "g", lambda m: None)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}") for n in range(5)])
    # dl on d: two rejected messages -> two dead letters, nothing pending, WARN.
    register("d", "dl", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("bad")))
    rejected = send_messages("d", [OutgoingMessage(n, partition_key="k") for n in range(2)])

    # r on rt: one message failing its first attempt, retried an hour later.
    def later(message: sqlqueue.Message) -> None:
        raise sqlqueue.Retry(delay=3600, reason="later")

    register("rt", "r", later)
    send_message("rt", 1, partition_key="k")
    # On MySQL a watermark trails the newest rows by the write horizon: wait for it.
    drain_until_watermarks("dl", {"k": rejected[-1].offset})
    drain(["r"], max_messages=1)

    # A live subscriber of g holding k0 (its heartbeat and lease are fresh).
    now = now_ms()
    SubscriberHeartbeat.objects.create(consumer_group="g", topic="t", subscriber_name="w1",
                                       heartbeat_at=now)
    PartitionLease.objects.create(consumer_group="g", topic="t", partition_key="k0",
                                  leased_by="w1", leased_at=now, lease_renewed_at=now)

    s = scrape(admin_client)
    assert value(s, "sqlqueue_pending_messages", "g", "t") == 5
    assert value(s, "sqlqueue_pending_capped", "g", "t") == 0
    assert value(s, "sqlqueue_oldest_pending_seconds", "g", "t") >= 0
    assert value(s, "sqlqueue_live_subscribers", "g", "t") == 1
    assert value(s, "sqlqueue_partitions", "g", "t", state="held") == 1
    assert value(s, "sqlqueue_partitions", "g", "t", state="not_held") == 1
    # k1 is pending and nobody holds it: STOP, and only STOP is 1.
    assert {name: value(s, "sqlqueue_status", "g", "t", status=name)
            for name in ("OK", "WARN", "STALL", "STOP")} == {
        "OK": 0, "WARN": 0, "STALL": 0, "STOP": 1}

    assert value(s, "sqlqueue_dead_letters", "dl", "d") == 2
    assert value(s, "sqlqueue_pending_messages", "dl", "d") == 0
    assert value(s, "sqlqueue_status", "dl", "d", status="WARN") == 1
    assert value(s, "sqlqueue_live_subscribers", "dl", "d") == 0  # said goodbye

    assert value(s, "sqlqueue_retrying_messages", "r", "rt") == 1
    assert value(s, "sqlqueue_in_flight_messages", "r", "rt") == 0
    assert value(s, "sqlqueue_pending_messages", "r", "rt") == 1
    assert s[("sqlqueue_scrape_duration_seconds", ())] >= 0


def test_an_old_pending_message_reports_its_age(admin_client: Client,
                                                register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_message("t", 1, partition_key="k")
    from sqlqueue.models import QueueMessage

    QueueMessage.objects.filter(offset=sent.offset).update(created_at=now_ms() - 90_000)
    s = scrape(admin_client)
    assert 90 <= value(s, "sqlqueue_oldest_pending_seconds", "g", "t") < 120


def test_openmetrics_when_asked(admin_client: Client) -> None:
    response = admin_client.get(reverse(METRICS),
                                headers={"Accept": "application/openmetrics-text"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_permission_and_token() -> None:
    url = reverse(METRICS)
    assert Client().get(url).status_code == 403  # anonymous
    assert staff_with("view_deadletter").get(url).status_code == 403
    viewer = staff_with("view_consumerlag")
    assert viewer.get(url).status_code == 200
    # No token configured: a bearer is refused.
    assert Client().get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403
    with override_settings(SQLQUEUE={"METRICS_TOKEN": TOKEN}):
        assert Client().get(url, headers={"Authorization": f"Bearer {TOKEN}"}
                            ).status_code == 200
        for bad in (f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN):
            assert Client().get(url, headers={"Authorization": bad}).status_code == 403, bad
        # A wrong bearer is refused even on a session that could read the page.
        assert viewer.get(url, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert Client().post(url).status_code == 405


def test_no_answer_is_stored_by_a_cache() -> None:
    """Audit W10: every answer, given or refused, says no-store and private, and varies
    on the bearer token."""
    url = reverse(METRICS)
    with override_settings(SQLQUEUE={"METRICS_TOKEN": TOKEN}):
        answers = [Client().get(url, headers={"Authorization": f"Bearer {TOKEN}"}),
                   staff_with("view_consumerlag").get(url), Client().get(url)]
    assert [a.status_code for a in answers] == [200, 200, 403]
    for answer in answers:
        directives = {d.strip() for d in answer.headers["Cache-Control"].split(",")}
        assert {"no-store", "private"} <= directives, answer.headers["Cache-Control"]
        assert "Authorization" in answer.headers["Vary"]


def test_the_exposition_is_prometheus_clients() -> None:
    """``gauges_text`` writes the bytes ``prometheus_client`` writes, in both formats,
    label values and help texts escaped (quotes, backslashes, new lines)."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from prometheus_client.registry import CollectorRegistry

    from sqlqueue.metrics import gauges_text

    class Gauges:
        def collect(self) -> Any:
            family = GaugeMetricFamily("sqlqueue_x", 'a "help" \\ text\nof two lines',
                                       labels=["topic", "group"])
            for labels, number in ((['t"1\\\n', "g"], 1.0), (["t", "g"], float("inf")),
                                   (["u", "g"], 12345678901.5), (["v", "é"], 1e-7),
                                   (["w", "g"], -0.0)):
                family.add_metric(labels, number)
            yield family
            yield GaugeMetricFamily("sqlqueue_y", "no labels", value=0.25)

    registry = CollectorRegistry()
    registry.register(Gauges())  # type: ignore[arg-type]
    assert gauges_text(registry) == generate_latest(registry)
    assert gauges_text(registry, openmetrics=True) == openmetrics(registry)
