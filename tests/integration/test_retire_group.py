"""Retiring a consumer group (SPEC §9): its state goes, and garbage collection proceeds."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse

import sqlqueue
from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.consuming.registry import unregister
from sqlqueue.models import (
    DeadLetter,
    DeliveryState,
    PartitionLease,
    PartitionOffset,
    QueueMessage,
    SubscriberHeartbeat,
)
from sqlqueue.operations import flow
from sqlqueue.operations.retire import CannotRetire, retire_group
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain_until_watermarks, queue, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def reject_first(message: sqlqueue.Message) -> None:
    if message.payload == 0:
        raise sqlqueue.Reject("not this one")


def a_group_that_left(register: Any) -> None:
    """``gone`` consumed two messages of ``t`` (one dead-lettered), then left the code;
    ``kept`` consumed everything."""
    register("t", "kept", lambda m: None)
    register("t", "gone", reject_first)
    first = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}")
                                for n in range(2)])
    drain_until_watermarks("gone", {s.partition_key: s.offset for s in first})
    unregister("gone", "t")
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}")
                               for n in range(2, 6)])
    drain_until_watermarks("kept", {s.partition_key: s.offset for s in sent})
    # A delivery state of the group left behind (say, a message it was retrying).
    DeliveryState.objects.create(consumer_group="gone", topic="t", partition_key="k0",
                                 message_offset=10**9, retry_count=1)
    flow.pause("gone", "t")


def trace(group: str) -> dict[str, int]:
    return {model.__name__: model.objects.filter(consumer_group=group).count()
            for model in (PartitionOffset, PartitionLease, SubscriberHeartbeat,
                          DeliveryState, DeadLetter)}


def test_retire_then_gc_collects_what_the_group_held_back(register: Any) -> None:
    a_group_that_left(register)
    queue("gc")
    assert QueueMessage.objects.filter(topic="t").count() == 4  # held back by "gone"
    assert trace("gone")["DeadLetter"] == 1
    progress: list[tuple[str, int]] = []
    retired = retire_group("gone", on_progress=lambda table, n: progress.append((table, n)))
    assert retired.topics == ["t"]
    assert retired.deleted["dead letters"] == 1 and retired.deleted["offsets"] == 2
    assert ("offsets", 2) in progress
    assert set(trace("gone").values()) == {0}
    assert not flow.is_paused("gone", "t")
    assert trace("kept")["PartitionOffset"] == 2  # another group's state is untouched
    queue("gc")
    assert QueueMessage.objects.filter(topic="t").count() == 0


def test_retire_group_command_asks_for_yes_and_reports(register: Any) -> None:
    a_group_that_left(register)
    with pytest.raises(CommandError, match="add --yes"):
        queue("retire-group", "gone")
    assert trace("gone")["PartitionOffset"] == 2
    out = queue("retire-group", "gone", "--topic", "t", "--yes")
    assert "Retired group gone on t" in out and "1 dead letters" in out
    with pytest.raises(CommandError, match="nothing to retire"):
        queue("retire-group", "gone", "--yes")


def test_a_live_group_is_not_retired(register: Any) -> None:
    a_group_that_left(register)
    with connection.cursor() as cursor:
        store_for(connection).heartbeat(cursor, "gone", "t", "worker-1")
    with pytest.raises(CannotRetire, match="live subscribers \\(worker-1\\)"):
        retire_group("gone", "t")
    assert trace("gone")["PartitionOffset"] == 2  # nothing deleted


def test_retire_in_batches(register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlqueue.operations import retire

    monkeypatch.setattr(retire, "RETIRE_BATCH", 3)
    DeliveryState.objects.bulk_create([
        DeliveryState(consumer_group="old", topic="t", partition_key=f"k{n % 2}",
                      message_offset=n) for n in range(10)])
    progress: list[tuple[str, int]] = []
    retired = retire_group("old", "t", on_progress=lambda t, n: progress.append((t, n)))
    assert retired.deleted["delivery states"] == 10
    assert [n for t, n in progress if t == "delivery states"] == [3, 5, 8, 10]


def test_admin_retire_for_a_group_nobody_runs(register: Any) -> None:
    a_group_that_left(register)
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        codename__in=["view_consumerlag", "retire_group"]))
    client = Client()
    client.force_login(user)
    query = "?group=gone&topic=t"
    page = client.get(reverse("admin:sqlqueue_consumerlag_subscription") + query)
    assert 'id="sqlqueue-retire"' in page.content.decode()
    url = reverse("admin:sqlqueue_consumerlag_retire") + query
    assert "Retire <b>gone</b>" in client.get(url).content.decode()
    assert client.post(url, {"confirmed": "yes"}).status_code == 302
    assert set(trace("gone").values()) == {0}
    viewer = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_consumerlag"))
    client.force_login(viewer)
    assert client.post(url, {"confirmed": "yes"}).status_code in (403, 404)


def test_a_group_still_in_the_code_is_not_offered_nor_retired(register: Any) -> None:
    """Issue 37: "Retire this group" was offered for a group registered in the code that
    simply had no worker running (its next deploy would count it again)."""
    register("t", "stopped", lambda m: None)
    send_messages("t", [OutgoingMessage(1, partition_key="k")])
    PartitionOffset.objects.create(consumer_group="stopped", topic="t", partition_key="k",
                                   updated_at=0)
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    page = client.get(reverse("admin:sqlqueue_consumerlag_subscription")
                      + "?group=stopped&topic=t").content.decode()
    assert "STOP" in page and 'id="sqlqueue-retire"' not in page
    with pytest.raises(CannotRetire, match="still registered in the code on t"):
        retire_group("stopped", "t")
    assert trace("stopped")["PartitionOffset"] == 1
