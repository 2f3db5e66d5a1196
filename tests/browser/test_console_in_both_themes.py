"""Issue 53's console pages in a real browser, on this stack's Django (5.2 or 6.1), in the
admin's light and dark themes, at 1366 px: the Messages page's RETENTION note (F3), the
Dead letters list, the Subscribers page's stopped runners with what stopped them (F16),
the lag overview and a subscription's page refreshing in place (F16), the live overview
over 6 and 24 hours (F7, F1) and a failed task's grouped tracebacks (F6). Each page: its
text readable against its background (WCAG contrast), nothing scrolling sideways. (The
Schedules page's are tests/browser/test_schedules_in_chromium.py's.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from sqlqueue import storage
from sqlqueue.consuming.control import STOPPED_KEPT_MS
from sqlqueue.models import SubscriberHeartbeat
from tests.browser.test_admin_in_chromium import (
    Admin,
    _no_sideways_scroll,
    create_operator,
    django_version_tag,
    operator_scene,
)
from tests.browser.test_schedules_in_chromium import contrast, use_theme
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]

#: WCAG AA for body text
READABLE = 4.5


def stopped_runners_scene() -> None:
    """Runners that stopped by a signal and by recycling, and one found dead."""
    store = storage.store(connection)
    with connection.cursor() as cursor:
        store.record_runner_stop(cursor, "web-5.1001", "drain", "signal", "SIGTERM", 1500,
                                   STOPPED_KEPT_MS)
        store.record_runner_stop(cursor, "web-6.1002", "drain", "recycle",
                                   "--max-messages 50", 0, STOPPED_KEPT_MS)
        store.heartbeat(cursor, "billing", "orders", "web-7.1003")
    SubscriberHeartbeat.objects.filter(subscriber_name="web-7.1003").update(
        heartbeat_at=F("heartbeat_at") - 120_000)  # killed two minutes ago


def minute_stats_scene() -> None:
    """Numbers of the last minute and of 3 and 20 hours ago."""
    store = storage.store(connection)
    with connection.cursor() as cursor:
        now = store.database_now_ms(cursor)
        minute = now - now % 60_000
        store.add_minute_stats(cursor, {
            ("billing", "orders", minute - ago * 60_000): {"published": n, "ack": n,
                                                           "duration_03": n}
            for ago, n in ((0, 4), (180, 30), (20 * 60, 60))})


def refreshed_in_place(browser: Chrome, marked: str) -> bool:
    """Mark an element of the content, refresh as the page's timer does, and see the
    element replaced by a fresh one without a reload."""
    browser.execute_script("window.sqlqueueNotReloaded = true;"
                           f"document.querySelector({marked!r}).dataset.served = 'yes';")
    browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                 "window.sqlqueueRefresh().then(() => done());")
    return bool(browser.execute_script(
        f"return document.querySelector({marked!r}).dataset.served === undefined"
        " && window.sqlqueueNotReloaded === true"))


def readable(browser: Chrome, css: str, theme: str) -> None:
    elements = browser.find_elements(By.CSS_SELECTOR, css)
    assert elements, f"nothing matches {css}"
    for element in elements[:5]:
        ratio = contrast(element, browser)
        assert ratio >= READABLE, f"{css} in the {theme} theme: contrast {ratio:.2f}"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_console_reads_in_both_themes(live_server: Any, browser: Chrome,
                                          screenshots: Path, theme: str,
                                          register: Callable[..., Any]) -> None:
    version = django_version_tag()
    operator_scene(register)
    stopped_runners_scene()
    minute_stats_scene()
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    browser.set_window_size(1366, 900)
    try:
        admin.open("/admin/sqlqueue/queuemessage/")
        use_theme(admin, theme)
        note = browser.find_element(By.ID, "sqlqueue-retention-note")
        assert 'SQLQUEUE["RETENTION"]' in note.text and note.is_displayed()
        readable(browser, "#sqlqueue-retention-note", theme)
        _no_sideways_scroll(browser, "Messages")
        admin.shot(f"53-messages-{theme}-{version}")

        admin.open("/admin/sqlqueue/deadletter/")
        assert "mailbox of customer 3 does not exist" in admin.text()
        readable(browser, "#result_list td", theme)
        _no_sideways_scroll(browser, "Dead letters")
        admin.shot(f"53-dead-letters-{theme}-{version}")

        admin.open("/admin/sqlqueue/subscriberstatus/")
        rows = {row.get_attribute("data-runner"): row for row in browser.find_elements(
            By.CSS_SELECTOR, "#sqlqueue-runners .sqlqueue-stopped-runner")}
        assert "by the signal SIGTERM (drained)" in rows["web-5.1001"].text
        assert "recycled by its supervisor (--max-messages 50)" in rows["web-6.1002"].text
        assert "found dead: its heartbeat stopped with no goodbye" in rows["web-7.1003"].text
        readable(browser, "#sqlqueue-runners td", theme)
        _no_sideways_scroll(browser, "Subscribers and leases")
        admin.shot(f"53-subscribers-stopped-runners-{theme}-{version}")
        assert refreshed_in_place(browser, "#sqlqueue-runners")

        admin.open("/admin/sqlqueue/consumerlag/")
        readable(browser, "#content-main td", theme)
        _no_sideways_scroll(browser, "Consumer lag")
        admin.shot(f"53-lag-overview-{theme}-{version}")
        assert refreshed_in_place(browser, "#content-main table")
        admin.open("/admin/sqlqueue/consumerlag/subscription/?group=emails&topic=orders")
        readable(browser, "#sqlqueue-partitions td.sqlqueue-key", theme)
        _no_sideways_scroll(browser, "a subscription's lag page")
        admin.shot(f"53-lag-subscription-{theme}-{version}")
        assert refreshed_in_place(browser, "#sqlqueue-partitions")
        assert "updated" in browser.find_element(By.ID, "sqlqueue-page-updated").text

        admin.open("/admin/sqlqueue/liveoverview/?minutes=360")
        card = browser.find_element(By.CSS_SELECTOR, '.sqlqueue-activity-card'
                                                     '[data-group="billing"]')
        assert "34" in card.find_element(
            By.CSS_SELECTOR, 'tr[data-series="published"] .sqlqueue-hour').text
        chart = card.find_element(By.CSS_SELECTOR, "svg.sqlqueue-activity-chart")
        ticks = [t.text for t in chart.find_elements(By.CSS_SELECTOR,
                                                     "text[text-anchor=middle]")]
        assert ticks[:3] == ["now", "-2", "-4"] and "hours ago (database time)" in ticks
        readable(browser, "svg.sqlqueue-activity-chart text", theme)
        _no_sideways_scroll(browser, "the live overview over 6 h")
        admin.shot(f"53-live-overview-6h-{theme}-{version}")
        admin.click_link("24 h")
        assert "?minutes=1440" in browser.current_url
        card = browser.find_element(By.CSS_SELECTOR, '.sqlqueue-activity-card'
                                                     '[data-group="billing"]')
        assert "94" in card.find_element(
            By.CSS_SELECTOR, 'tr[data-series="published"] .sqlqueue-hour').text
        readable(browser, "svg.sqlqueue-activity-chart text", theme)
        admin.shot(f"53-live-overview-24h-{theme}-{version}")
    finally:
        browser.set_window_size(1400, 1000)
        browser.execute_script("localStorage.removeItem('theme')")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_failed_task_s_grouped_tracebacks_read_in_both_themes(
        live_server: Any, browser: Chrome, screenshots: Path, theme: str) -> None:
    pytest.importorskip("sqlqueue.integrations.tasks.compat", exc_type=ImportError)
    from tests.testapp import tasks

    failed = tasks.needs_order.enqueue("ORD-404")
    drain(["tasks"])
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    browser.set_window_size(1366, 900)
    try:
        admin.open(f"/admin/sqlqueue/taskrecord/{failed.id}/change/")
        use_theme(admin, theme)
        (entry,) = browser.find_elements(By.CSS_SELECTOR, ".sqlqueue-task-error")
        assert "Attempts 1-3 (3 times the same error)" in entry.text
        readable(browser, ".sqlqueue-task-error p", theme)
        readable(browser, ".sqlqueue-task-error pre", theme)
        _no_sideways_scroll(browser, "a failed task's page")
        admin.shot(f"53-failed-task-{theme}-{django_version_tag()}")
    finally:
        browser.set_window_size(1400, 1000)
        browser.execute_script("localStorage.removeItem('theme')")
