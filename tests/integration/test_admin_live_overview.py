"""The live overview page (issue 42) as the admin renders it: the rollup's rows as
numbers and charts, its fragment for the in-place refresh, its empty state and its
permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from sqlqueue.admin.activity_charts import latency_chart
from sqlqueue.operations.overview import Minute, histogram_quantile
from sqlqueue.storage import store

pytestmark = pytest.mark.django_db
URL = "/admin/sqlqueue/liveoverview/"


@pytest.fixture
def operator(client: Client) -> Client:
    User.objects.create_superuser("operator", "ops@example.com", "pw")
    client.login(username="operator", password="pw")
    return client


def add_rows() -> int:
    with connection.cursor() as cursor:
        dialect = store(connection)
        now = dialect.database_now_ms(cursor)
        minute = now - now % 60_000
        dialect.add_minute_stats(cursor, {
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
