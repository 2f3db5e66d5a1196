"""The admin pages and actions, with the Django test client."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

import sqlqueue
from sqlqueue import send_message
from sqlqueue.models import DeadLetter, QueueMessage
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]
MESSAGES = "admin:sqlqueue_queuemessage_changelist"
DEAD = "admin:sqlqueue_deadletter_changelist"


@pytest.fixture
def admin_client() -> Client:
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def staff_with(*codenames: str) -> Client:
    name = "staff-" + "-".join(codenames)
    user = User.objects.create_user(name[:150], "staff@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def dead_letters(register: Any, count: int = 2) -> list[DeadLetter]:
    register("t", "g", lambda m: (_ for _ in ()).throw(sqlqueue.Reject("<b>bad</b>")))
    for n in range(count):
        send_message("t", {"n": n}, partition_key="k", id=f"m{n}")
    drain(["g"])
    return list(DeadLetter.objects.order_by("offset"))


def test_message_pages_escape_payloads(admin_client: Client) -> None:
    sent = send_message("orders", {"note": "<script>alert(1)</script>"}, partition_key="c-1")
    page = admin_client.get(reverse(MESSAGES))
    assert page.status_code == 200 and b"orders" in page.content
    detail = admin_client.get(reverse("admin:sqlqueue_queuemessage_change",
                                      args=[sent.offset]))
    assert detail.status_code == 200
    assert b"<script>alert(1)" not in detail.content
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in detail.content
    # Trial F15 (issue 53): an operator's page shows no schema help texts and no (always
    # empty) History button.
    assert b"lower is delivered first" not in detail.content
    assert b"historylink" not in detail.content


def test_messages_filter_by_creation_date(admin_client: Client) -> None:
    send_message("orders", 1)
    today = dt.datetime.now(tz=dt.UTC).date()
    in_range = admin_client.get(reverse(MESSAGES), {
        "created_at__range__gte": (today - dt.timedelta(days=1)).isoformat(),
        "created_at__range__lte": (today + dt.timedelta(days=1)).isoformat()})
    assert in_range.status_code == 200 and b'class="field-topic">orders' in in_range.content
    past = admin_client.get(reverse(MESSAGES), {"created_at__range__lte": "2001-01-01"})
    assert b'class="field-topic">orders' not in past.content


def test_nothing_is_editable(admin_client: Client) -> None:
    sent = send_message("orders", 1)
    assert admin_client.get(reverse("admin:sqlqueue_queuemessage_add")).status_code == 403
    change = reverse("admin:sqlqueue_queuemessage_change", args=[sent.offset])
    admin_client.post(change, {"topic": "other"})
    assert QueueMessage.objects.get(offset=sent.offset).topic == "orders"


def test_dead_letter_page_and_replay(admin_client: Client, register: Any) -> None:
    first, second = dead_letters(register)
    page = admin_client.get(reverse(DEAD))
    assert page.status_code == 200
    assert b"&lt;b&gt;bad&lt;/b&gt;" in page.content and b"<b>bad</b>" not in page.content
    response = admin_client.post(reverse(DEAD), {
        "action": "replay", "_selected_action": [first.offset]}, follow=True)
    assert b"Replayed 1 dead letter(s)." in response.content
    assert list(DeadLetter.objects.values_list("offset", flat=True)) == [second.offset]
    assert QueueMessage.objects.filter(topic="t", consumer_group="g").count() == 1


def test_the_dead_letters_list_refreshes_itself_but_not_under_the_operator(
        admin_client: Client, register: Any) -> None:
    """Issue 53: the list reloads its content every 10 s as the Subscribers and Consumer
    lag pages do, skipping while rows are selected or a field is changed or focused."""
    dead_letters(register)
    page = admin_client.get(reverse(DEAD)).text
    assert "Refreshed every 10 seconds" in page and 'id="sqlqueue-page-updated"' in page
    main = page.index('id="content-main"')
    script = page.index("window.sqlqueueRefresh")
    assert page.index('id="result_list"') > main and script > page.index("</form>", main)
    refresh = page[page.index("function refresh()", main):script]
    assert "touched(box)" in refresh and "box.contains(document.activeElement)" in refresh
    assert "window.Actions(rows)" in refresh  # selecting works on the new rows


def test_discard_asks_first(admin_client: Client, register: Any) -> None:
    first, _ = dead_letters(register)
    ask = admin_client.post(reverse(DEAD), {"action": "discard",
                                            "_selected_action": [first.offset]})
    assert ask.status_code == 200 and b"Yes, discard them" in ask.content
    assert DeadLetter.objects.filter(offset=first.offset).exists()
    done = admin_client.post(reverse(DEAD), {"action": "discard", "confirmed": "yes",
                                             "_selected_action": [first.offset]}, follow=True)
    assert b"Discarded 1 dead letter(s)." in done.content
    assert not DeadLetter.objects.filter(offset=first.offset).exists()


def test_viewing_is_not_acting(register: Any) -> None:
    first, _ = dead_letters(register)
    viewer = staff_with("view_deadletter", "view_queuemessage")
    assert viewer.get(reverse(DEAD)).status_code == 200
    response = viewer.post(reverse(DEAD), {"action": "replay",
                                           "_selected_action": [first.offset]}, follow=True)
    assert b"Replayed" not in response.content
    assert DeadLetter.objects.filter(offset=first.offset).exists()
    stranger = staff_with()
    assert stranger.get(reverse(DEAD)).status_code == 403


def test_replay_permission_alone_allows_replay(register: Any) -> None:
    first, _ = dead_letters(register)
    replayer = staff_with("view_deadletter", "replay_deadletter")
    replayer.post(reverse(DEAD), {"action": "replay", "_selected_action": [first.offset]})
    assert not DeadLetter.objects.filter(offset=first.offset).exists()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_the_change_page_renders_any_stored_nesting(admin_client: Client) -> None:
    """F6 of the security audit: a payload at the nesting limit renders; so does one nested
    far deeper (stored before the limit, or by another client), shown as stored."""
    from sqlqueue.naming import MAX_JSON_DEPTH

    at_limit = send_message("deep", _nested(MAX_JSON_DEPTH), partition_key="k")
    stored = send_message("deep", 1, partition_key="k")
    deep_text = "[" * 20_000 + "1" + "]" * 20_000
    QueueMessage.objects.filter(offset=stored.offset).update(payload=deep_text.encode())
    for offset in (at_limit.offset, stored.offset):
        page = admin_client.get(reverse("admin:sqlqueue_queuemessage_change", args=[offset]))
        assert page.status_code == 200
    assert b"[[[[[[[[" in page.content
