"""Issue 16's admin: why a message is retrying (per message and per partition), Replay and
Discard on a dead letter's page, pending on the lag overview (the metrics' numbers), no
false STOP after a clean exit, and the same numbers beyond the count budget."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import sqlqueue
from sqlqueue import OutgoingMessage, send_message, send_messages
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import (
    DeadLetter,
    DeliveryState,
    PartitionLease,
    PartitionOffset,
    QueueMessage,
    SubscriberHeartbeat,
)
from sqlqueue.operations import lag as lag_rules
from sqlqueue.operations.lag import group_lag, lag_overview
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import (
    drain,
    drain_until_watermarks,
    fast_settings,
    register,
)
from tests.integration.test_admin import admin_client, dead_letters, staff_with
from tests.integration.test_admin_dashboards import LAG, at, badges
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client", "register"]
SUBSCRIPTION = "admin:sqlqueue_consumerlag_subscription"


def now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def overview_row(html: str, group: str, topic: str) -> str:
    """The lag overview's row of one subscription (other tests' consumers have rows too)."""
    rows = re.findall(r"<tr class=\"row[12]\">(.*?)</tr>", html, re.S)
    (row,) = [r for r in rows if f"group={group}&amp;topic={topic}\">{group}<" in r]
    return row


def smtp_busy(register: Any) -> int:
    """One message of g on t failing with a known error, retried an hour later."""
    def handler(message: sqlqueue.Message) -> None:
        raise ConnectionError("SMTP server mx.example.com refused the connection")

    register("t", "g", handler, max_attempts=5, min_backoff=3600, max_backoff=3600)
    sent = send_message("t", {"to": "<b>ops</b>"}, partition_key="k")
    drain(["g"], max_messages=1)
    return sent.offset


def test_a_retrying_message_says_why_on_its_page_and_its_partition(
        admin_client: Client, register: Any) -> None:
    offset = smtp_busy(register)
    assert DeliveryState.objects.get(message_offset=offset).last_error
    page = admin_client.get(reverse("admin:sqlqueue_queuemessage_change", args=[offset]))
    text = page.content.decode()
    assert page.status_code == 200
    table = text[text.index('id="sqlqueue-delivery"'):]
    # The next attempt is an hour away (the database's clock, shown in UTC).
    state = DeliveryState.objects.get(message_offset=offset)
    due = dt.datetime.fromtimestamp(state.invisible_until / 1000, tz=dt.UTC)
    assert re.search(r"<td>g</td><td>retrying</td><td>1</td><td>[^<]+</td>", table), table[:600]
    assert due.strftime("%Y") in table.split("</td>")[3]
    assert "ConnectionError: SMTP server mx.example.com refused the connection" in table
    subscription = admin_client.get(at(SUBSCRIPTION, group="g", topic="t")).content.decode()
    assert 'class="sqlqueue-last-error"' in subscription
    assert "SMTP server mx.example.com refused the connection" in subscription


def test_a_message_lists_every_group_of_its_topic(admin_client: Client,
                                                  register: Any) -> None:
    """Issue 37: a group that acked it (its delivery state dropped once the watermark
    passed) and a group that never started it were left out."""
    register("t", "fast", lambda m: None)
    register("t", "idle", lambda m: None)
    sent = send_message("t", 1, partition_key="k")

    def rows() -> list[tuple[str, ...]]:
        page = admin_client.get(reverse("admin:sqlqueue_queuemessage_change",
                                        args=[sent.offset])).content.decode()
        start = page.index('id="sqlqueue-delivery"')
        table = page[start:page.index("</table>", start)]
        return [tuple(re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[:4])
                for row in table.split("<tr>")[2:]]

    assert rows() == [("fast", "not started", "-", "-"), ("idle", "not started", "-", "-")]
    drain_until_watermarks("fast", {"k": sent.offset})
    assert rows() == [("fast", "done", "-", "-"), ("idle", "not started", "-", "-")]


def test_a_topic_nobody_consumes_says_so(admin_client: Client) -> None:
    sent = send_message("nobody.reads", 1, partition_key="k")
    page = admin_client.get(reverse("admin:sqlqueue_queuemessage_change", args=[sent.offset]))
    assert b"no consumer group consumes this topic yet" in page.content


def test_replay_and_discard_from_a_dead_letters_page(admin_client: Client,
                                                     register: Any) -> None:
    first, second = dead_letters(register)
    detail = admin_client.get(reverse("admin:sqlqueue_deadletter_change", args=[first.offset]))
    assert b'id="sqlqueue-replay-one"' in detail.content
    assert b'id="sqlqueue-discard-one"' in detail.content
    # Trial F15 (issue 53): no schema help texts, no (always empty) History button.
    assert b"for every group; else only this group" not in detail.content
    assert b"historylink" not in detail.content

    replay = reverse("admin:sqlqueue_deadletter_replay_one", args=[first.offset])
    ask = admin_client.get(replay)
    assert ask.status_code == 200 and b"Yes, replay it" in ask.content
    assert DeadLetter.objects.filter(offset=first.offset).exists()  # asking changes nothing
    done = admin_client.post(replay, {"confirmed": "yes"}, follow=True)
    assert b"Replayed 1 dead letter(s)." in done.content
    assert not DeadLetter.objects.filter(offset=first.offset).exists()
    assert QueueMessage.objects.filter(topic="t", consumer_group="g").count() == 1
    again = admin_client.post(replay, {"confirmed": "yes"}, follow=True)
    assert b"was replayed or discarded already" in again.content

    discard = reverse("admin:sqlqueue_deadletter_discard_one", args=[second.offset])
    assert b"Yes, discard it" in admin_client.get(discard).content
    admin_client.post(discard, {"confirmed": "yes"})
    assert not DeadLetter.objects.exists()


def test_dead_letter_buttons_need_their_permission_and_a_csrf_token(register: Any) -> None:
    (dead,) = dead_letters(register, count=1)
    viewer = staff_with("view_deadletter")
    detail = viewer.get(reverse("admin:sqlqueue_deadletter_change", args=[dead.offset]))
    assert detail.status_code == 200
    assert b"sqlqueue-replay-one" not in detail.content
    assert b"sqlqueue-discard-one" not in detail.content
    for name in ("replay_one", "discard_one"):
        url = reverse(f"admin:sqlqueue_deadletter_{name}", args=[dead.offset])
        assert viewer.post(url, {"confirmed": "yes"}).status_code == 403
    replayer = staff_with("view_deadletter", "replay_deadletter")
    discard = reverse("admin:sqlqueue_deadletter_discard_one", args=[dead.offset])
    assert replayer.post(discard, {"confirmed": "yes"}).status_code == 403
    # A forged cross-site POST (no CSRF token) is refused even with the permission.
    replayer.handler.enforce_csrf_checks = True
    replay = reverse("admin:sqlqueue_deadletter_replay_one", args=[dead.offset])
    assert replayer.post(replay, {"confirmed": "yes"}).status_code == 403
    assert DeadLetter.objects.filter(offset=dead.offset).exists()


def test_the_overview_shows_pending_as_the_metrics_do(admin_client: Client,
                                                      register: Any) -> None:
    register("t", "g", lambda m: None)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 3}") for n in range(7)])
    row = overview_row(admin_client.get(reverse(LAG)).content.decode(), "g", "t")
    assert re.findall(r'class="sqlqueue-pending">([^<]*)<', row) == ["7"]
    assert value(scrape(admin_client), "sqlqueue_pending_messages", "g", "t") == 7


def test_a_clean_until_empty_exit_leaves_no_false_stop(admin_client: Client,
                                                       register: Any) -> None:
    """The write horizon may hold the watermark below messages the group acked when
    ``runconsumer --until-empty`` leaves (MariaDB: for up to MAX_TRANSACTION_AGE). The
    subscriber said goodbye and released its leases: nothing is pending, so no STOP."""
    register("t", "g", lambda m: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    DeliveryState.objects.bulk_create([
        DeliveryState(consumer_group="g", topic="t", partition_key="k",
                      message_offset=m.offset, acked=True, acked_at=now_ms())
        for m in sent])
    now = now_ms()
    SubscriberHeartbeat.objects.create(consumer_group="g", topic="t", subscriber_name="w1",
                                       heartbeat_at=now, deregistered_at=now)
    lag = group_lag("g", "t")
    assert (lag.status, lag.pending, lag.lagging) == ("OK", 0, 0)
    assert badges(overview_row(admin_client.get(reverse(LAG)).content.decode(), "g", "t")
                  ) == ["OK"]
    s = scrape(admin_client)
    assert value(s, "sqlqueue_status", "g", "t", status="STOP") == 0
    assert value(s, "sqlqueue_pending_messages", "g", "t") == 0
    # A message published after the run is pending again, and nobody holds it: STOP.
    send_message("t", 9, partition_key="k")
    assert group_lag("g", "t").status == "STOP"
    assert group_lag("g", "t").pending == 1


def test_beyond_the_count_budget_ages_and_statuses_stay_exact(
        register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """More lagging partitions than the budget counts: each is known to hold at least one
    message (pending is a lower bound, flagged), and the first pending message of each
    is found by the cheaper probe, with the same ages and statuses."""
    register("t", "g", lambda m: None)
    register("t", "other", lambda m: None)
    send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 3}") for n in range(9)])
    # A replay for another group heads k3: not pending for g.
    replay = send_message("t", "replay", partition_key="k3")
    QueueMessage.objects.filter(offset=replay.offset).update(consumer_group="other")
    QueueMessage.objects.filter(partition_key="k0").update(created_at=now_ms() - 90_000)
    now = now_ms()
    PartitionLease.objects.create(consumer_group="g", topic="t", partition_key="k0",
                                  leased_by="w1", leased_at=now, lease_renewed_at=now)
    counted = {lag.group: lag for lag in lag_overview()}
    monkeypatch.setattr(lag_rules, "COUNT_BUDGET", 2)
    monkeypatch.setattr(lag_rules, "MIN_PARTITION_CAP", 1)
    with CaptureQueriesContext(connection) as statements:
        probed = {lag.group: lag for lag in lag_overview()}
    # Both groups stand at 0 on every partition: one probe statement serves them both.
    probes = first_probe()
    assert sum(q["sql"].startswith(probes) for q in statements.captured_queries) == 1
    for group in ("g", "other"):
        before, after = counted[group], probed[group]
        assert [(p.partition_key, p.lagging, p.status) for p in after.partitions] == [
            (p.partition_key, p.lagging, p.status) for p in before.partitions]
        assert after.oldest_pending_age == pytest.approx(before.oldest_pending_age, abs=5)
        assert after.pending == after.lagging and after.pending_capped
    assert (counted["g"].pending, counted["g"].lagging, counted["g"].status) == (9, 3, "STOP")
    assert counted["other"].lagging == 4
    assert not counted["g"].pending_capped
    assert 90 <= probed["g"].oldest_pending_age < 120


def test_a_runconsumer_leaves_a_hint_that_spares_the_probes(
        register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a handler holds message 3, the runner moves the watermark over 0-2 and
    records 3 as the partition's first pending message (queue_offsets.first_pending).
    Beyond the count budget the lag service then needs no probe for it, and says what
    the exact count says; 4 and 5, acked above the watermark, are not taken for it."""
    release = threading.Event()

    def handler(message: sqlqueue.Message) -> None:
        if message.payload == 3:
            release.wait(60)

    register("t", "g", handler)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(6)])
    runner = Runner(select_consumers(["g"], []), threads=2, until_empty=True,
                    conf=fast_settings())

    def run() -> None:
        try:
            runner.run(install_signal_handlers=False)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        hinted = (sent[2].offset, sent[3].offset)
        deadline = time.monotonic() + 30
        while (PartitionOffset.objects.filter(consumer_group="g").values_list(
                "offset_acked", "first_pending").first() != hinted
               or DeliveryState.objects.filter(consumer_group="g", acked=True).count() < 2):
            assert time.monotonic() < deadline, "the watermark and hint never came"
            time.sleep(0.05)
        counted = group_lag("g", "t")
        monkeypatch.setattr(lag_rules, "COUNT_BUDGET", 0)
        with CaptureQueriesContext(connection) as statements:
            probed = group_lag("g", "t")
        probes = first_probe()
        assert not any(q["sql"].startswith(probes) for q in statements.captured_queries)
        assert [(p.lagging, p.status) for p in probed.partitions] == [
            (p.lagging, p.status) for p in counted.partitions] == [(True, "OK")]
        assert probed.oldest_pending_age == pytest.approx(counted.oldest_pending_age, abs=5)
    finally:
        release.set()
        thread.join(30)
    assert not thread.is_alive()
    assert PartitionOffset.objects.filter(consumer_group="g").values_list(
        "offset_acked", flat=True).get() <= sent[5].offset


def test_a_hint_whose_message_is_gone_is_not_used(register: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    register("t", "g", lambda m: None)
    sent = send_messages("t", [OutgoingMessage(n, partition_key="k") for n in range(3)])
    now = now_ms()
    PartitionOffset.objects.create(consumer_group="g", topic="t", partition_key="k",
                                   offset_acked=0, updated_at=now,
                                   first_pending=sent[2].offset + 1000)  # no such message
    monkeypatch.setattr(lag_rules, "COUNT_BUDGET", 0)
    lag = group_lag("g", "t")
    # The probe finds the real first message: 0, created just now.
    assert lag.partitions[0].lagging
    assert lag.oldest_pending_age is not None and lag.oldest_pending_age < 60
    QueueMessage.objects.filter(offset=sent[0].offset).update(created_at=now - 600_000)
    assert group_lag("g", "t").oldest_pending_age >= 600


def first_probe() -> str:
    """The opening of a ``first_offsets_above`` probe, to find it among statements run."""
    return store_for(connection).sql.first_offsets_above("", [("", 0)])[0].split(",")[0][:25]
