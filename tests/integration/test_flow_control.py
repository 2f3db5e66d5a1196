"""Flow control in one process: pause and resume through the operations, the CLI and the
admin, and what a paused runner does (SPEC §9)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.consuming.pauses import PauseWatch, matches
from sqlqueue.consuming.server import Head
from sqlqueue.models import FlowControl
from sqlqueue.operations import flow
from sqlqueue.operations.lag import PartitionLag, group_lag, partition_status
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain, fast_settings, queue, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def test_pause_scopes_and_resume() -> None:
    assert flow.pause("g", "t", by="me")
    assert not flow.pause("g", "t")  # already paused
    assert flow.pause(topic="other")
    assert flow.pause(group="everywhere")
    assert flow.is_paused("g", "t") and not flow.is_paused("g", "t2")
    assert flow.is_paused("any-group", "other") and flow.is_paused("everywhere", "x")
    assert [(p.group, p.topic) for p in flow.pauses()] == [
        ("g", "t"), ("", "other"), ("everywhere", "")]
    assert flow.resume("g", "t") and not flow.resume("g", "t")
    assert not flow.is_paused("g", "t")


@pytest.mark.parametrize("group,topic", [(None, None), ("", ""), ("g\n", "t"),
                                         ("g", "x" * 256)])
def test_a_bad_pause_is_refused_and_writes_nothing(group: Any, topic: Any) -> None:
    with pytest.raises(flow.InvalidPause):
        flow.pause(group, topic)
    assert FlowControl.objects.count() == 0


def test_list_pauses_statement() -> None:
    flow.pause("g", "t")
    flow.pause(topic="t2")
    with connection.cursor() as cursor:
        assert sorted(store_for(connection).list_pauses(cursor)) == [("", "t2"), ("g", "t")]


def test_pause_watch_reads_at_most_once_an_interval() -> None:
    reads: list[int] = []

    def read() -> list[tuple[str, str]]:
        reads.append(1)
        return [("g", "")]

    watch = PauseWatch(read, interval=60)
    assert watch.refresh() and watch.paused("g", "t")
    assert not watch.refresh() and len(reads) == 1
    assert matches([("", "t")], "any", "t") and not matches([("g", "t")], "g", "u")


def test_a_paused_runner_handles_nothing_and_keeps_its_leases(register: Any) -> None:
    handled: list[int] = []
    register("t", "g", lambda m: handled.append(m.offset))
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    flow.pause("g", "t")
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    runner = Runner(select_consumers(["g"]), conf=fast_settings())
    runner.start_handler_threads()
    for _ in range(20):
        runner.run_once()
    assert handled == []
    assert runner.subscribers[0].partitions  # leased, heartbeating
    lag = group_lag("g", "t")
    assert lag.status == "PAUSED" and lag.held == 1
    assert runner.pacer.next_delay(Head(lambda: sent[-1].offset)) == runner.conf.POLL_INTERVAL
    runner.stop()
    runner.shutdown()
    flow.resume("g", "t")
    drain(["g"])
    assert sorted(handled) == [s.offset for s in sent]


def test_queued_deliveries_are_given_back_when_paused(register: Any) -> None:
    """A delivery fetched before the pause but not started yet is given back."""
    handled: list[int] = []
    register("t", "g", lambda m: handled.append(m.offset))
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner

    runner = Runner(select_consumers(["g"]), conf=fast_settings())
    runner.run_once()  # leases
    while not runner.pool.work.qsize():
        runner.run_once()  # fetched and queued; no handler thread runs yet
    runner.pauses.pauses = frozenset({("g", "t")})
    runner.pauses._next_read = float("inf")
    runner.start_handler_threads()
    for _ in range(30):
        runner.run_once()
        if runner.pool.in_flight == 0:
            break
    assert handled == [] and runner.pool.in_flight == 0
    states = list(runner.subscribers[0].partitions["k"].entries.values())
    assert states and all(not e.in_flight for e in states)
    runner.stop()
    runner.shutdown()


def test_a_paused_group_is_never_stall() -> None:
    stalled = PartitionLag("k", 10, 1, lagging=True, pending=9, in_flight=0, retrying=0,
                           dead_letters=0, oldest_pending_age=10_000, leased_by="w",
                           lease_age=0.1, watermark_age=10_000)
    assert partition_status(stalled) == "STALL"
    assert partition_status(stalled, paused=True) == "PAUSED"
    stalled.leased_by = ""
    assert partition_status(stalled, paused=True) == "STOP"  # nobody would resume it


def test_cli_pause_resume_and_pauses(register: Any) -> None:
    register("orders", "billing", lambda m: None)
    assert "Paused group billing on topic orders" in queue("pause", "--group", "billing",
                                                           "--topic", "orders")
    assert "group billing on topic orders" in queue("pauses")
    assert "PAUSED" in queue("status")
    assert "Resumed" in queue("resume", "--group", "billing", "--topic", "orders")
    assert "Nothing is paused." in queue("pauses")
    with pytest.raises(CommandError, match="No pause of"):
        queue("resume", "--group", "billing", "--topic", "orders")
    with pytest.raises(CommandError, match="No consumer group 'nope'"):
        queue("pause", "--group", "nope")
    with pytest.raises(CommandError, match="Name a group, a topic, or both"):
        queue("pause")
    assert "every group on topic orders" in queue("pause", "--topic", "orders")


def test_admin_pause_needs_its_permission(register: Any) -> None:
    register("orders", "billing", lambda m: None)
    send_messages("orders", [1])
    url = reverse("admin:sqlqueue_consumerlag_pause") + "?group=billing&topic=orders"
    page = reverse("admin:sqlqueue_consumerlag_subscription") + "?group=billing&topic=orders"

    def staff(*codenames: str) -> Client:
        user = User.objects.create_user("-".join(codenames), "s@example.com", "pw",
                                        is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        client = Client()
        client.force_login(user)
        return client

    viewer = staff("view_consumerlag")
    assert viewer.post(url, {"do": "pause"}).status_code == 403
    assert 'id="sqlqueue-pause"' not in viewer.get(page).content.decode()
    operator = staff("view_consumerlag", "pause_subscription")
    assert 'id="sqlqueue-pause"' in operator.get(page).content.decode()
    assert operator.post(url, {"do": "pause"}).status_code == 302
    assert flow.is_paused("billing", "orders")
    assert 'id="sqlqueue-resume"' in operator.get(page).content.decode()
    operator.post(url, {"do": "resume"})
    assert not flow.is_paused("billing", "orders")
