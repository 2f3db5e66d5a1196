"""The lag dashboard, the subscribers page, the repairs made from them (retry now, reset
position) and filter-wide dead-letter replay, with the Django test client."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

import sqlqueue
from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.admin import dead_letters as dead_letter_admin
from sqlqueue.models import DeadLetter, DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import (
    drain,
    drain_until_watermarks,
    fast_settings,
    register,
)
from tests.integration.test_admin import admin_client, staff_with

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]
LAG = "admin:sqlqueue_consumerlag_changelist"
SUBSCRIPTION = "admin:sqlqueue_consumerlag_subscription"
RETRY_NOW = "admin:sqlqueue_consumerlag_retry_now"
RESET = "admin:sqlqueue_consumerlag_reset_position"
SUBSCRIBERS = "admin:sqlqueue_subscriberstatus_changelist"
DEAD = "admin:sqlqueue_deadletter_changelist"
REPLAY_MATCHING = "admin:sqlqueue_deadletter_replay_matching"


def at(name: str, **query: str) -> str:
    from django.utils.http import urlencode

    return reverse(name) + ("?" + urlencode(query) if query else "")


def badges(html: str) -> list[str]:
    """The statuses shown as badges, in page order."""
    return re.findall(r'class="sqlqueue-status"[^>]*>(\w+)<', html)


def journal(register: Any, topic: str = "t", group: str = "g", **options: Any) -> list[int]:
    calls: list[int] = []
    register(topic, group, lambda m: calls.append(m.offset), **options)
    return calls


def test_overview_and_subscription_pages(admin_client: Client, register: Any) -> None:
    journal(register)
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}")
                               for n in range(5)])
    sent.append(send_message("t", "evil", partition_key="<script>alert(1)</script>"))

    overview = admin_client.get(reverse(LAG))
    assert overview.status_code == 200
    content = overview.content.decode()
    # Nobody consumes yet: pending, no lease holder -> STOP, with a chart per subscription.
    # Worst first; the other registered consumers (idle, OK) follow.
    first, *others = badges(content)
    assert first == "STOP" and set(others) == {"OK"}
    assert "<svg" in content and ">g</a>" in content
    assert "<script>alert(1)" not in content

    page = admin_client.get(at(SUBSCRIPTION, group="g", topic="t"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "<script>alert(1)" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert badges(text) == ["STOP"] * 4  # the summary, then one row per partition
    assert 'class="sqlqueue-columns"' in text
    # Trial F21: each partition's watermark beside its own newest offset (not the log's
    # head), and the page says the gap is no message count.
    newest = {key: max(m.offset for m in sent if m.partition_key == key)
              for key in ("k0", "k1")}
    assert max(newest.values()) < sent[-1].offset  # the log's head is another partition's
    positions = {key: shown.strip() for key, shown in re.findall(
        r'<td class="sqlqueue-key">(k\d)</td>\s*<td class="sqlqueue-position">([^<]+)', text)}
    assert positions == {key: f"0 / {newest[key]}" for key in ("k0", "k1")}, positions
    assert "acked up to / newest" in text and "is not a count of messages" in text

    # On MySQL a watermark trails the newest rows by the write horizon: wait for it.
    drain_until_watermarks("g", {s.partition_key: s.offset for s in sent})
    settled = admin_client.get(at(SUBSCRIPTION, group="g", topic="t")).content.decode()
    assert set(badges(settled)) == {"OK"}
    caught_up = re.search(r'<td class="sqlqueue-key">k0</td>\s*<td class="sqlqueue-position">'
                          r'([^<]+)', settled)
    assert caught_up is not None and caught_up.group(1).strip().endswith(" (caught up)"), (
        caught_up and caught_up.group(1))


def test_a_subscription_s_page_refreshes_itself(admin_client: Client, register: Any) -> None:
    """Trial F16 (issue 53): the lag subscription page reloads its content in place, as
    the lag overview, the Subscribers page and the Dead letters list do; its stamp
    stays outside the content it replaces. (A subscription with no message yet: its page
    answered HTTP 500 on Django 6, whose format_html() refuses to be called without
    arguments.)"""
    journal(register)
    text = admin_client.get(at(SUBSCRIPTION, group="g", topic="t")).content.decode()
    assert "Refreshed every 10 seconds" in text and "DOMParser" in text
    content = text[text.index('<div id="content-main"'):text.index('class="sqlqueue-refresh-note"')]
    assert 'id="sqlqueue-partitions"' in content and "sqlqueue-page-updated" not in content


def test_unknown_subscription_is_404(admin_client: Client) -> None:
    assert admin_client.get(at(SUBSCRIPTION, group="nope", topic="none")).status_code == 404


def test_retry_now_redelivers_a_backing_off_message(admin_client: Client,
                                                    register: Any) -> None:
    attempts: list[int] = []

    def handler(message: sqlqueue.Message) -> None:
        attempts.append(message.attempt)
        if message.attempt == 1:
            raise sqlqueue.Retry(delay=3600, reason="later")

    register("t", "g", handler)
    send_message("t", 1, partition_key="k")
    drain(["g"], max_messages=1)  # the first attempt fails; the retry is an hour away
    assert attempts == [1]
    page = admin_client.get(at(SUBSCRIPTION, group="g", topic="t")).content.decode()
    # A retry waits and no worker runs any more: STOP beats WARN.
    assert badges(page) == ["STOP", "STOP"] and "retry now" in page
    # Trial F8: Pause and "Retry all" in one row of buttons, the link drawn as a button
    # (role="button": Django 6.1 underlines other links).
    actions = page[page.index('<div id="sqlqueue-actions">'):]
    actions = actions[:actions.index("</div>")]
    assert 'class="button sqlqueue-action" id="sqlqueue-pause"' in actions
    assert 'class="button sqlqueue-action" role="button" id="sqlqueue-retry-all"' in actions
    # The retrying message's last error is shown on its partition's row.
    assert re.search(r'<td>1<div class="sqlqueue-last-error" title="[^"]*later[^"]*">', page)

    ask = admin_client.get(at(RETRY_NOW, group="g", topic="t", partition="k"))
    assert ask.status_code == 200 and b"Yes, retry now" in ask.content
    done = admin_client.post(at(RETRY_NOW, group="g", topic="t", partition="k"),
                             {"confirmed": "yes"}, follow=True)
    assert b"1 message(s) of g on t (partition k) will be delivered again now." in done.content
    assert DeliveryState.objects.get(consumer_group="g").invisible_until == 0
    drain(["g"])
    assert attempts == [1, 2]


def test_reset_position_rewinds_and_skips(admin_client: Client, register: Any) -> None:
    calls = journal(register)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    offsets = [s.offset for s in sent]
    # Keep finished messages (garbage collection would delete them): they are rewound to.
    keep = fast_settings(RETENTION=3600)
    drain_until_watermarks("g", {"k": offsets[-1]}, conf=keep)
    assert calls == offsets

    url = at(RESET, group="g", topic="t", partition="k")
    form = admin_client.get(url)
    assert form.status_code == 200 and b"Deliver again from offset" in form.content
    confirm = admin_client.post(url, {"mode": "from_offset", "offset": offsets[1]})
    assert b"Yes, reset the position" in confirm.content
    assert PartitionOffset.objects.get(consumer_group="g").offset_acked >= offsets[2]
    done = admin_client.post(url, {"mode": "from_offset", "offset": offsets[1],
                                   "confirmed": "yes"}, follow=True)
    assert f"Reset g on t/k: every stored message from offset {offsets[1]} on".encode() \
        in done.content
    drain(["g"], conf=keep)
    assert calls == offsets + offsets[1:]  # delivered again from the chosen offset

    more = send_message("t", 9, partition_key="k")
    admin_client.post(url, {"mode": "to_head", "confirmed": "yes"})
    assert PartitionOffset.objects.get(consumer_group="g").offset_acked == more.offset
    drain(["g"])
    assert more.offset not in calls


def test_reset_position_refuses_bad_input(admin_client: Client, register: Any) -> None:
    journal(register)
    sent = send_message("t", 1, partition_key="k")
    url = at(RESET, group="g", topic="t", partition="k")
    missing = admin_client.post(url, {"mode": "from_offset", "confirmed": "yes"})
    assert b"Give the offset to deliver again from." in missing.content
    beyond = admin_client.post(url, {"mode": "from_offset", "offset": sent.offset + 5,
                                     "confirmed": "yes"})
    assert b"is beyond partition" in beyond.content
    assert not PartitionOffset.objects.filter(consumer_group="g").exists()
    nowhere = admin_client.get(at(RESET, group="g", topic="t", partition="nope"))
    assert nowhere.status_code == 404


def test_viewers_cannot_repair(register: Any) -> None:
    journal(register)
    send_message("t", 1, partition_key="k")
    viewer = staff_with("view_consumerlag")
    page = viewer.get(at(SUBSCRIPTION, group="g", topic="t"))
    assert page.status_code == 200 and b"reset position" not in page.content
    assert viewer.get(at(RETRY_NOW, group="g", topic="t")).status_code == 403
    reset = at(RESET, group="g", topic="t", partition="k")
    assert viewer.post(reset, {"mode": "to_head", "confirmed": "yes"}).status_code == 403
    assert not PartitionOffset.objects.filter(consumer_group="g").exists()
    assert viewer.get(reverse(SUBSCRIBERS)).status_code == 403
    stranger = staff_with()
    assert stranger.get(reverse(LAG)).status_code == 403
    resetter = staff_with("view_consumerlag", "reset_position")
    assert resetter.post(reset, {"mode": "to_head", "confirmed": "yes"}).status_code == 302
    assert PartitionOffset.objects.get(consumer_group="g").offset_acked > 0


def test_subscribers_page_shows_holders_and_stale_leases(admin_client: Client,
                                                         register: Any) -> None:
    journal(register)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n}") for n in range(3)])
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.heartbeat(cursor, "g", "t", "worker-a")
        store.acquire_leases(cursor, "g", "t", ["k0", "k1"], "worker-a", 60_000)
        store.acquire_leases(cursor, "g", "t", ["k2"], "worker-gone", 60_000)
        # worker-gone stopped renewing two minutes ago.
        cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = "
                       "lease_renewed_at - 120000 WHERE leased_by = 'worker-gone'")
    page = admin_client.get(reverse(SUBSCRIBERS))
    assert page.status_code == 200
    text = page.content.decode()
    assert "worker-a" in text and "k0, k1" in text
    assert "Stale leases" in text and "worker-gone" in text
    assert "1 not held" in text
    assert staff_with("view_subscriberstatus").get(reverse(SUBSCRIBERS)).status_code == 200


def test_replay_every_dead_letter_matching_a_filter(admin_client: Client, register: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def reject(message: sqlqueue.Message) -> None:
        raise sqlqueue.Reject("no")

    register("t", "g1", reject)
    register("t", "g2", reject)
    send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(2)])
    drain(["g1", "g2"])
    assert DeadLetter.objects.count() == 4

    listing = admin_client.get(reverse(DEAD), {"consumer_group": "g1"})
    assert b"Replay all matching" in listing.content
    url = at(REPLAY_MATCHING, consumer_group="g1")
    ask = admin_client.get(url)
    assert ask.status_code == 200
    assert "the 2 dead letters matching" in " ".join(ask.content.decode().split())
    # One a click here: the page says how many were replayed and whether more match.
    monkeypatch.setattr(dead_letter_admin, "BULK_REPLAY_LIMIT", 1)
    done = admin_client.post(url, {"confirmed": "yes"}, follow=True)
    assert b"Replayed 1 dead letter(s)." in done.content and b"More match" in done.content
    done = admin_client.post(url, {"confirmed": "yes"}, follow=True)
    assert b"Replayed 1 dead letter(s)." in done.content
    assert b"No more dead letters match these filters." in done.content
    assert set(DeadLetter.objects.values_list("consumer_group", flat=True)) == {"g2"}
    assert QueueMessage.objects.filter(topic="t", consumer_group="g1").count() == 2
    viewer = staff_with("view_deadletter")
    assert b"Replay all matching" not in viewer.get(reverse(DEAD)).content
    assert viewer.post(at(REPLAY_MATCHING), {"confirmed": "yes"}).status_code == 403
    assert DeadLetter.objects.count() == 2


def test_a_revoked_lease_has_no_age(admin_client: Client, register: Any) -> None:
    """An operator's repair stamps a revoked lease 0: shown as never renewed, not as
    "20780 d ago", and the partition as held by nobody."""
    from sqlqueue.models import PartitionLease, SubscriberHeartbeat
    from sqlqueue.operations.positions import reset_position

    journal(register)
    sent = send_message("t", 1, partition_key="k")
    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
    SubscriberHeartbeat.objects.create(consumer_group="g", topic="t", subscriber_name="w1",
                                       heartbeat_at=now)
    PartitionLease.objects.create(consumer_group="g", topic="t", partition_key="k",
                                  leased_by="w1", leased_at=now, lease_renewed_at=now)
    reset_position("g", "t", "k", deliver_from=sent.offset)
    assert PartitionLease.objects.get(partition_key="k").lease_renewed_at == 0
    subscribers = admin_client.get(reverse(SUBSCRIBERS)).content.decode()
    assert "(revoked by an operator)" in subscribers
    assert re.search(r"\d{4,} d ago", subscribers) is None
    assert "<td>never</td>" in subscribers
    page = admin_client.get(at(SUBSCRIPTION, group="g", topic="t")).content.decode()
    assert re.search(r"\d{4,} d ago", page) is None
    assert badges(page) == ["STOP", "STOP"]  # pending, and nobody holds it
