"""Issue 42: an operator asks a runner, by name, to drain and stop or to stop at once
(sqlqueue.operations.runners); the runner's timer (sqlqueue.consuming.control) reads the
request once per renew interval, logs who asked, and stops. The real process is in
tests/acceptance/test_runner_control.py."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.db.models import F

from sqlqueue import events
from sqlqueue.consuming.control import RunnerControl
from sqlqueue.models import RunnerRequest, SubscriberHeartbeat
from sqlqueue.operations.runners import (
    STOPPED_SHOWN_MS,
    NotARunningRunner,
    RunnerNameTaken,
    live_runners,
    pending_requests,
    refuse_a_live_namesake,
    request_runner_stop,
    stopped_runners,
)
from sqlqueue.storage.sql import store_for

pytestmark = pytest.mark.django_db(transaction=True)


def alive(name: str) -> None:
    with connection.cursor() as cursor:
        store_for(connection).heartbeat(cursor, "g", "t", name)


class Clock:
    """The database's clock, moved on by the test."""

    def __init__(self) -> None:
        with connection.cursor() as cursor:
            self.ms = store_for(connection).database_now_ms(cursor)

    def __call__(self) -> int:
        return self.ms


def control_of(name: str, clock: Clock, stops: list[bool]) -> RunnerControl:
    control = RunnerControl(name, "default", clock, 10_000, stops.append)
    control.mark_start()
    return control


def test_only_a_live_runner_can_be_asked_and_the_action_is_named() -> None:
    alive("web-1.42")
    assert live_runners() == ["web-1.42"]
    with pytest.raises(NotARunningRunner, match=r"No live runner named 'web-9\.99'"):
        request_runner_stop("web-9.99", "drain")
    with pytest.raises(NotARunningRunner, match="Unknown action 'pause'"):
        request_runner_stop("web-1.42", "pause")
    SubscriberHeartbeat.objects.update(deregistered_at=1)  # said goodbye
    with pytest.raises(NotARunningRunner):
        request_runner_stop("web-1.42", "stop")
    assert not RunnerRequest.objects.exists()


def test_the_runner_obeys_within_one_renew_interval_and_logs_who_asked(
        caplog: pytest.LogCaptureFixture) -> None:
    alive("web-1.42")
    clock, stops = Clock(), []
    control = control_of("web-1.42", clock, stops)
    control.run_due()  # nothing asked yet: its next read is one interval away
    assert stops == [] and control.next_due_ms() == clock.ms + 10_000
    clock.ms += 1
    request_runner_stop("web-1.42", "drain", by="alice")
    assert [p.description for p in pending_requests()] == ["drain and stop"]
    clock.ms += 5_000
    control.run_due()
    assert stops == []  # not due yet: the polls cost no statement
    clock.ms += 5_000
    with caplog.at_level(logging.WARNING, logger="sqlqueue.consumer"):
        control.run_due()
    assert stops == [False]
    (record,) = [r for r in caplog.records
                 if getattr(r, "event", None) == events.RUNNER_STOP_REQUESTED]
    assert "the user 'alice' asked this runner to drain and stop" in record.getMessage()
    assert (record.subscriber, record.action, record.requested_by) == (  # type: ignore[attr-defined]
        "web-1.42", "drain", "alice")
    assert pending_requests() == [] and RunnerRequest.objects.get().obeyed_at > 0
    assert control.next_due_ms() is None  # obeyed once: it reads no more


def test_a_request_names_who_asked_quoted(caplog: pytest.LogCaptureFixture) -> None:
    """Audit W8: a custom user model's username may hold a line break: it cannot forge a
    log line."""
    alive("web-1.42")
    clock, stops = Clock(), []
    control = control_of("web-1.42", clock, stops)
    clock.ms += 1
    request_runner_stop("web-1.42", "stop", by="eve\nINFO all good")
    clock.ms += 10_000
    with caplog.at_level(logging.WARNING, logger="sqlqueue.consumer"):
        control.run_due()
    assert stops == [True]
    assert "web-1.42: the user 'eve\\nINFO all good' asked this runner" in caplog.text
    assert "\nINFO all good" not in caplog.text


class Waits:
    """``refuse_a_live_namesake``'s sleep and monotonic clock, moved by the test; each
    wait may do something meanwhile (the other runner heartbeats)."""

    def __init__(self, meanwhile: object = None) -> None:
        self.now, self.waited = 0.0, 0.0
        self.meanwhile = meanwhile

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.waited += seconds
        if callable(self.meanwhile):
            self.meanwhile()

    def monotonic(self) -> float:
        return self.now


def test_a_runner_never_starts_under_the_name_of_a_live_one() -> None:
    """Audit W8: two runners of one name shared a heartbeat and their leases, and a stop
    request reached only one of them."""
    alive("dup")

    def heartbeat_again() -> None:  # the other runner is alive: its heartbeat moves
        SubscriberHeartbeat.objects.filter(subscriber_name="dup").update(
            heartbeat_at=F("heartbeat_at") + 1)

    waits = Waits(heartbeat_again)
    with pytest.raises(RunnerNameTaken, match="A runner named 'dup' is running"):
        refuse_a_live_namesake("dup", sleep=waits.sleep, monotonic=waits.monotonic)
    assert 0 < waits.waited <= 0.25  # refused at its first look


def test_a_crashed_runners_name_is_taken_over_once_its_heartbeat_stands_still() -> None:
    alive("crashed")  # live, but nobody renews it any more
    waits = Waits()
    refuse_a_live_namesake("crashed", sleep=waits.sleep, monotonic=waits.monotonic)
    assert waits.waited >= 1.5 * 10  # one and a half LEASE_RENEW_INTERVAL (10 s)


def test_a_free_or_stopped_name_starts_at_once() -> None:
    waits = Waits()
    refuse_a_live_namesake("free", sleep=waits.sleep, monotonic=waits.monotonic)
    alive("stopped")
    SubscriberHeartbeat.objects.filter(subscriber_name="stopped").update(deregistered_at=1)
    refuse_a_live_namesake("stopped", sleep=waits.sleep, monotonic=waits.monotonic)
    assert waits.waited == 0


def test_stop_at_once_is_passed_on() -> None:
    alive("web-1.42")
    clock, stops = Clock(), []
    control = control_of("web-1.42", clock, stops)
    clock.ms += 1
    request_runner_stop("web-1.42", "stop", by="bob")
    control.run_due()
    assert stops == [True]


def test_a_request_for_an_earlier_process_of_the_same_name_is_ignored() -> None:
    alive("worker-a")
    request_runner_stop("worker-a", "drain", by="alice")
    clock, stops = Clock(), []
    clock.ms += 1  # this process started after the request
    control = control_of("worker-a", clock, stops)
    control.run_due()
    assert stops == [] and pending_requests() == []
    assert control.next_due_ms() == clock.ms + 10_000  # still listening


def test_the_admin_asks_after_confirmation_and_logs_who_asked() -> None:
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission, User
    from django.test import Client
    from django.urls import reverse

    alive("web-1.42")
    boss = User.objects.create_user("boss", "boss@example.com", "pw", is_staff=True)
    boss.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_subscriberstatus", "stop_runner"]))
    client = Client()
    client.force_login(boss)
    page = client.get(reverse("admin:sqlqueue_subscriberstatus_changelist"))
    url = reverse("admin:sqlqueue_subscriberstatus_stop_runner")
    assert f"{url}?runner=web-1.42&amp;action=drain" in page.text

    asked = client.get(url, {"runner": "web-1.42", "action": "drain"})
    assert "Ask runner web-1.42 to drain and stop?" in asked.text
    assert not RunnerRequest.objects.exists()  # asking changes nothing
    done = client.post(f"{url}?runner=web-1.42&action=drain", {"confirmed": "yes"},
                       follow=True)
    assert "Asked runner web-1.42 to drain and stop; it obeys within" in done.text
    assert "asked to drain and stop by boss; not obeyed yet" in done.text
    request = RunnerRequest.objects.get()
    assert (request.action, request.requested_by) == ("drain", "boss")
    entry = LogEntry.objects.get()
    assert entry.user == boss and entry.object_id == "web-1.42"
    assert "Asked runner web-1.42 to drain and stop." in entry.get_change_message()

    gone = client.post(f"{url}?runner=web-9.99&action=stop", {"confirmed": "yes"},
                       follow=True)
    assert "No live runner named" in gone.text


def test_asking_a_runner_needs_its_permission() -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client
    from django.urls import reverse

    alive("web-1.42")
    viewer = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_subscriberstatus"))
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("admin:sqlqueue_subscriberstatus_changelist"))
    assert "web-1.42" in page.text and "stop at once" not in page.text
    url = reverse("admin:sqlqueue_subscriberstatus_stop_runner")
    assert client.post(f"{url}?runner=web-1.42&action=stop",
                       {"confirmed": "yes"}).status_code == 403
    assert not RunnerRequest.objects.exists()


def test_a_stopped_runner_stays_listed_with_who_asked_and_when() -> None:
    """Trial F16 (issue 53): after a drain the runner does not vanish from the
    Subscribers page: it is listed as stopped, with who asked and when it obeyed."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    alive("web-1.42")
    alive("web-2.7")
    clock, stops = Clock(), []
    control = control_of("web-1.42", clock, stops)
    clock.ms += 1
    request_runner_stop("web-1.42", "drain", by="alice")
    clock.ms += 10_000
    control.run_due()
    assert stops == [False]
    SubscriberHeartbeat.objects.filter(subscriber_name="web-1.42").update(
        deregistered_at=clock.ms)  # it said goodbye

    (stopped,) = stopped_runners()
    assert (stopped.runner, stopped.description, stopped.requested_by) == (
        "web-1.42", "drain and stop", "alice")
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = client.get(reverse("admin:sqlqueue_subscriberstatus_changelist")).text
    row = page[page.index('data-runner="web-1.42"'):]
    row = row[:row.index("</tr>")]
    assert "stopped: asked to drain and stop by alice at" in row and "obeyed at" in row
    assert "action=drain" not in row  # nothing more to ask of it
    assert "runner=web-2.7&amp;action=drain" in page  # the live one can still be asked
    assert 'id="sqlqueue-page-updated"' in page  # the page refreshes itself

    # Started again under its name: live, so no longer listed as stopped; and a stop
    # older than a day is not listed either.
    SubscriberHeartbeat.objects.filter(subscriber_name="web-1.42").update(deregistered_at=0)
    assert stopped_runners() == []
    SubscriberHeartbeat.objects.filter(subscriber_name="web-1.42").update(deregistered_at=1)
    assert [r.runner for r in stopped_runners()] == ["web-1.42"]
    RunnerRequest.objects.update(obeyed_at=F("obeyed_at") - STOPPED_SHOWN_MS - 60_000)
    assert stopped_runners() == []


def test_the_lag_overview_refreshes_itself() -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = client.get(reverse("admin:sqlqueue_consumerlag_changelist")).text
    assert "Refreshed every 10 seconds" in page and "DOMParser" in page
