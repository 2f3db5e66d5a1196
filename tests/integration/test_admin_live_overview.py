"""The live overview page (issue 42) as the admin renders it: the rollup's rows as
numbers and charts, its fragment for the in-place refresh, its empty state and its
permission."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from sqlqueue import storage
from sqlqueue.admin.activity_charts import (
    latency_chart,
    nice_ticks,
    throughput_chart,
    tick_text,
)
from sqlqueue.models import CollectionRun
from sqlqueue.operations.overview import Minute, histogram_quantile

pytestmark = pytest.mark.django_db
URL = "/admin/sqlqueue/liveoverview/"


@pytest.fixture
def operator(client: Client) -> Client:
    User.objects.create_superuser("operator", "ops@example.com", "pw")
    client.login(username="operator", password="pw")
    return client


def add_rows() -> int:
    with connection.cursor() as cursor:
        store = storage.store(connection)
        now = store.database_now_ms(cursor)
        minute = now - now % 60_000
        store.add_minute_stats(cursor, {
            ("billing", "orders", minute): {"published": 4, "ack": 3, "fail": 1,
                                           "dead_lettered": 1, "duration_02": 3,
                                           "duration_05": 1, "duration_sum": 0.3},
            ("billing", "orders", minute - 10 * 60_000): {"published": 2, "ack": 2,
                                                           "duration_00": 2},
        })
    return minute


def test_the_page_shows_the_hour_s_numbers_and_labelled_charts(operator: Client) -> None:
    add_rows()
    page = operator.get(URL).content.decode()
    assert "billing on orders" in page
    assert 'data-series="published"' in page and "minutes ago (database time)" in page
    assert "6 published, 5 acked, 0 retried, 1 dead-lettered" in page
    assert page.count('class="sqlqueue-activity-chart"') == 2
    assert "What the numbers count" in page and "window.setInterval" in page
    fragment = operator.get(URL, {"fragment": "1"}).content.decode()
    assert "billing on orders" in fragment and "<html" not in fragment


def test_an_empty_hour_says_how_numbers_come(operator: Client) -> None:
    assert "appear once a" in operator.get(URL).content.decode()


def test_the_page_needs_the_view_permission(client: Client) -> None:
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    client.login(username="clerk", password="pw")
    assert client.get(URL).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_liveoverview"))
    assert client.get(URL).status_code == 200


def test_a_single_minute_of_latency_is_drawn_as_markers() -> None:
    minutes = [Minute(i * 60_000) for i in range(60)]
    minutes[-1].durations[3] = 2
    chart = str(latency_chart(minutes, "one minute"))
    assert "<circle" in chart and "<rect" in chart and "<polyline" not in chart
    assert histogram_quantile(0.5, minutes[-1].durations) == pytest.approx(0.0375)


# Trial F1 and F7 (issue 53): charts that follow the admin's theme, round ticks, the
# current minute marked as partial, and a range selector.

def test_chart_text_and_axes_follow_the_admin_s_theme(operator: Client) -> None:
    add_rows()
    page = operator.get(URL).content.decode()
    charts = re.findall(r'<svg class="sqlqueue-activity-chart".*?</svg>', page, re.S)
    assert len(charts) == 2
    for chart in charts:
        assert "color:var(--body-fg" in chart
        texts = re.findall(r"<text[^>]*>", chart)
        assert texts and all('fill="currentColor"' in t for t in texts)
        assert "#666" not in chart and "#999" not in chart and "#ccc" not in chart
    # Each series has a lighter colour in the dark theme, chosen by Django's own switches.
    assert 'html[data-theme="dark"]{--sqlqueue-published:#64b5f6' in page
    assert ':root:not([data-theme="light"])' in page
    assert "var(--sqlqueue-dead-lettered, #c62828)" in page


@pytest.mark.parametrize(("top", "whole", "ticks"), [
    (0.0894, False, [0, 0.05, 0.1]),
    (0.0244, False, [0, 0.01, 0.02, 0.03]),
    (7, True, [0, 2, 4, 6, 8]),
    (1, True, [0, 1]),
    (0, True, [0, 1]),
    (1234, True, [0, 500, 1000, 1500]),
])
def test_y_ticks_are_round_numbers(top: float, whole: bool, ticks: list[float]) -> None:
    assert nice_ticks(top, whole) == pytest.approx(ticks)
    assert [tick_text(v) for v in nice_ticks(0.3, False)] == [
        "0", "0.1", "0.2", "0.3"]


def test_the_latency_axis_shows_round_ticks_not_the_maximum() -> None:
    minutes = [Minute(i * 60_000) for i in range(60)]
    minutes[-3].durations[3] = 2   # p50 0.0375 s, p95 0.04875 s
    chart = str(latency_chart(minutes, "round"))
    ticks = re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', chart)
    assert ticks == ["0", "0.02", "0.04", "0.06"]


def test_the_current_minute_is_drawn_apart_as_partial() -> None:
    minutes = [Minute(i * 60_000) for i in range(60)]
    for minute in minutes[-5:]:
        minute.published = 10
    minutes[-1].published = 2  # the current minute, a few seconds old
    chart = str(throughput_chart(minutes, "partial"))
    assert 'class="sqlqueue-partial-minute"' in chart and "this minute, so far" in chart
    published = re.search(r'<polyline points="([^"]+)"[^>]*style="stroke:var\('
                          r'--sqlqueue-published', chart)
    assert published is not None
    last_x = float(published.group(1).split()[-1].split(",")[0])
    assert last_x < 488  # the line of complete minutes stops one minute short of "now"
    assert re.search(r'<line class="sqlqueue-partial" x1="[\d.]+" y1="[\d.]+" x2="488"',
                     chart)


def test_the_range_selector_offers_ranges_the_rollup_keeps(operator: Client) -> None:
    minute = add_rows()  # rows this minute and 10 minutes ago
    page = operator.get(URL).content.decode()
    assert '<a href="?minutes=15">15 min</a>' in page
    assert '<strong aria-current="true">1 h</strong>' in page
    short = operator.get(URL, {"minutes": "15"}).content.decode()
    assert "last 15 min" in short and "6 published" in short
    assert "-10" in short and "-45" not in short
    assert 'fragment=1&minutes=15' in short  # the refresh keeps the range
    fragment = operator.get(URL, {"fragment": "1", "minutes": "30"}).content.decode()
    assert "last 30 min" in fragment
    with connection.cursor() as cursor:  # a row 20 minutes ago: outside 15, inside 30
        storage.store(connection).add_minute_stats(cursor, {
            ("billing", "orders", minute - 20 * 60_000): {"published": 5, "ack": 5}})
    assert "6 published" in operator.get(URL, {"minutes": "15"}).content.decode()
    assert "11 published" in operator.get(URL, {"minutes": "30"}).content.decode()
    refused = operator.get(URL, {"minutes": "2880"})
    assert refused.status_code == 400
    assert "choose one of 15, 30, 60, 360, 1440" in refused.content.decode()


@pytest.mark.parametrize(("minutes", "step", "ticks", "top"), [
    (360, 5, ["now", "-2", "-4"], "6"),
    (1440, 15, ["now", "-6", "-12", "-18"], "2"),
])
def test_ranges_of_hours_sum_minutes_into_points(operator: Client, minutes: int, step: int,
                                                 ticks: list[str], top: str) -> None:
    """Trial F7, beyond an hour: the runners keep the per-minute rows a day, and a chart
    of 6 or 24 hours sums them into points of 5 or 15 minutes, drawn as their average
    per minute, with the x axis in round hours."""
    with connection.cursor() as cursor:
        store = storage.store(connection)
        now = store.database_now_ms(cursor)
        minute = now - now % 60_000
        store.add_minute_stats(cursor, {
            ("billing", "orders", minute - (minutes - 30) * 60_000): {"published": 30,
                                                                     "ack": 30},
            ("billing", "orders", minute - 90 * 60_000): {"published": 3, "ack": 3},
            ("billing", "orders", minute - (minutes + 30) * 60_000): {"published": 500}})
    page = operator.get(URL, {"minutes": str(minutes)}).content.decode()
    assert f'<strong aria-current="true">{minutes // 60} h</strong>' in page
    assert f"last {minutes // 60} h" in page and "33 published" in page  # not the 500
    assert f"each point of the charts sums\n  {step} minutes" in page
    (chart,) = re.findall(r'<svg class="sqlqueue-activity-chart"[^>]*aria-label="[^"]*'
                          r'messages per minute \(average of each \d+ minutes\).*?</svg>',
                          page, re.S)
    x_ticks = re.findall(r'text-anchor="middle" font-size="11"[^>]*>([^<]+)</text>', chart)
    assert x_ticks == ticks
    assert "hours ago (database time)" in chart
    assert f"the last {step} minutes, this minute so far" in chart
    # 30 published in one minute of a point of `step` minutes: drawn as 30/step a minute.
    assert "per minute (avg of" in chart
    y_ticks = re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', chart)
    assert y_ticks[-1] == top
    assert 'refresh' in page and f'fragment=1&minutes={minutes}' in page


def test_points_are_summed_by_the_database_back_from_the_current_minute() -> None:
    """``read_minute_points``: over 6 hours, 72 points of 5 minutes, the last ending with
    the current minute; "this minute" read on its own."""
    from sqlqueue.operations.overview import activity, minutes_per_point

    with connection.cursor() as cursor:
        store = storage.store(connection)
        now = store.database_now_ms(cursor)
        minute = now - now % 60_000
        store.add_minute_stats(cursor, {
            ("g", "t", minute - ago * 60_000): {"published": n, "ack": n, "duration_03": n}
            for ago, n in ((0, 1), (4, 2), (5, 4), (9, 8), (359, 16), (360, 32))})
    (sub,) = activity(now_ms=now, minutes=360)
    assert (sub.step, len(sub.minutes)) == (5, 72)
    assert [m.published for m in sub.minutes[-2:]] == [4 + 8, 1 + 2]
    assert sub.minutes[0].published == 16 and sub.total.published == 31  # not the 32
    assert sub.minutes[-1].start_ms == minute - 4 * 60_000
    assert sub.this_minute.published == 1 and sub.this_minute.acked == 1
    assert sub.minutes[-1].p50 == pytest.approx(histogram_quantile(0.5, [0, 0, 0, 3] + [0] * 11))
    (hour,) = activity(now_ms=now, minutes=60)
    assert hour.step == 1 and hour.this_minute is hour.minutes[-1]
    assert [minutes_per_point(m) for m in (15, 60, 360, 1440)] == [1, 1, 5, 15]


def test_the_page_shows_the_runs_of_queue_gc(operator: Client) -> None:
    """A deep collection says what it is doing (issue 52): the running run of ``queue gc``
    first, with how far it got and how fast; one that went silent says so; then the
    finished ones."""
    now = int(time.time() * 1000)
    CollectionRun.objects.create(collector="queue gc on db1 (pid 7)", started_at=now - 50_000,
                                 updated_at=now - 1_000, messages=1_225_000, share=0.5)
    CollectionRun.objects.create(collector="queue gc on db1 (pid 3)", started_at=now - 900_000,
                                 updated_at=now - 800_000, finished_at=now - 800_000,
                                 messages=2_000_000)
    CollectionRun.objects.create(collector="queue gc on db2 (pid 9)", started_at=now - 400_000,
                                 updated_at=now - 300_000, messages=10)
    for page in (operator.get(URL).content.decode(),
                 operator.get(URL, {"fragment": "1"}).content.decode()):
        box = page[page.index('id="sqlqueue-gc-runs"'):]
        running, finished, silent = (box.index(f"(pid {pid})") for pid in (7, 3, 9))
        assert running < silent < finished  # the running run first, then the newest
        assert "sqlqueue-gc-running" in box and "sqlqueue-gc-silent" in box
        assert "1225000" in box and "<td>25000</td>" in box  # 1,225,000 rows in 49 s
        assert "deleting 0.50 of its time" in box and "no word since" in box
        assert "<td>20000</td>" in box  # the finished run: 2,000,000 rows in 100 s
    assert "appear once a" in page  # and the empty state of the charts below


def test_a_run_of_queue_gc_writes_its_row() -> None:
    from sqlqueue.operations.gc import collect_garbage

    assert collect_garbage(collector="queue gc in a test").messages == 0
    run = CollectionRun.objects.get(collector="queue gc in a test")
    assert run.finished_at >= run.started_at > 0 and run.messages == 0
