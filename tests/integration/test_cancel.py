"""Cancelling pending messages of a group, by id and by filter (#17)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import DeadLetter, DeliveryState, QueueMessage
from sqlqueue.operations import flow
from sqlqueue.operations.cancel import InvalidCancel, cancel_messages
from sqlqueue.operations.dead_letters import replay_dead_letter
from tests.integration.consuming_helpers import drain, queue, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


@pytest.fixture
def handled(register: Any) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = {"billing": [], "audit": []}
    for group in calls:
        register("orders", group, lambda m, g=group: calls[g].append(m.payload))
    return calls


def publish() -> None:
    send_messages("orders", [OutgoingMessage(n, partition_key=f"k{n % 2}", id=f"m{n}")
                             for n in range(6)])


def test_cancel_by_id_never_runs_for_that_group_only(handled: dict[str, list[int]]) -> None:
    publish()
    result = cancel_messages("billing", "orders", ids=["m1", "m4"], reason="refunded")
    assert (result.cancelled, result.skipped) == (2, 0)
    drain(["billing", "audit"])
    assert sorted(handled["billing"]) == [0, 2, 3, 5]
    assert sorted(handled["audit"]) == list(range(6))  # other groups unaffected (I6)
    cancelled = DeadLetter.objects.filter(consumer_group="billing").order_by("offset")
    assert sorted(d.failure_detail["id"] for d in cancelled) == ["m1", "m4"]  # type: ignore[index]
    assert all(d.failure_detail["reason"] == "cancelled" for d in cancelled)  # type: ignore[index]
    assert "Cancelled by an operator. refunded" in cancelled[0].last_error


def test_cancel_by_filter_and_replay_undoes_it(handled: dict[str, list[int]]) -> None:
    publish()
    result = cancel_messages("billing", "orders", partition_key="k0")
    assert result.cancelled == 3
    drain(["billing"])
    assert sorted(handled["billing"]) == [1, 3, 5]
    first = DeadLetter.objects.filter(consumer_group="billing").order_by("offset").first()
    assert first is not None
    replay_dead_letter(first.offset)  # a mistaken cancel, undone
    drain(["billing"])
    assert sorted(handled["billing"]) == [0, 1, 3, 5]


def test_done_and_running_messages_are_left_alone(handled: dict[str, list[int]]) -> None:
    publish()
    cancel_messages("billing", "orders", ids=["m0"])
    drain(["billing"])
    again = cancel_messages("billing", "orders", upto_offset=10**9)
    assert again.cancelled == 0 and again.skipped >= 5  # already done: nothing to cancel
    # A first attempt running right now (delivered, invisible) is not pending.
    send_messages("orders", [OutgoingMessage(9, partition_key="k9", id="m9")])
    row = QueueMessage.objects.get(topic="orders", id="m9")
    DeliveryState.objects.create(consumer_group="billing", topic="orders", partition_key="k9",
                                 message_offset=row.offset, invisible_until=2**62)
    assert cancel_messages("billing", "orders", ids=["m9"]).skipped == 1


def test_a_paused_group_can_be_cancelled_then_resumed(handled: dict[str, list[int]]) -> None:
    flow.pause("billing", "orders")
    publish()
    cancel_messages("billing", "orders", upto_offset=10**9)
    flow.resume("billing", "orders")
    drain(["billing"])
    assert handled["billing"] == []


def test_bad_cancels_are_refused(handled: dict[str, list[int]]) -> None:
    with pytest.raises(InvalidCancel, match="No consumer group"):
        cancel_messages("nope", "orders", ids=["m1"])
    with pytest.raises(InvalidCancel, match="Select the messages"):
        cancel_messages("billing", "orders")
    with pytest.raises(InvalidCancel, match="offset >= 1"):
        cancel_messages("billing", "orders", upto_offset=0)


def test_cli_cancel(handled: dict[str, list[int]]) -> None:
    publish()
    with pytest.raises(CommandError, match="--yes"):
        queue("cancel", "billing", "orders", "--id", "m2")
    out = queue("cancel", "billing", "orders", "--id", "m2", "--id", "m3", "--yes")
    assert "Cancelled 2 pending message(s) of billing on orders." in out
    m5 = QueueMessage.objects.get(topic="orders", id="m5").offset
    out = queue("cancel", "billing", "orders", "--partition", "k1", "--upto", str(m5),
                "--yes")
    assert "Cancelled 2 pending" in out  # m1, m5 (m3 was already)
    with pytest.raises(CommandError, match="Select the messages"):
        queue("cancel", "billing", "orders", "--yes")
    drain(["billing"])
    assert sorted(handled["billing"]) == [0, 4]


def test_admin_cancel_action_asks_for_the_group(handled: dict[str, list[int]]) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client
    from django.urls import reverse

    publish()
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        codename__in=["view_queuemessage", "cancel_message"]))
    client = Client()
    client.force_login(user)
    url = reverse("admin:sqlqueue_queuemessage_changelist")
    offsets = [str(QueueMessage.objects.get(topic="orders", id=i).offset) for i in ("m0", "m1")]
    page = client.post(url, {"action": "cancel_for_group", "_selected_action": offsets})
    assert "billing on orders" in page.content.decode()
    client.post(url, {"action": "cancel_for_group", "_selected_action": offsets,
                      "confirmed": "yes", "subscription": "billing/orders"})
    drain(["billing", "audit"])
    assert sorted(handled["billing"]) == [2, 3, 4, 5]
    assert sorted(handled["audit"]) == list(range(6))
    viewer = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_queuemessage"))
    client.force_login(viewer)
    assert "cancel_for_group" not in client.get(url).content.decode()
