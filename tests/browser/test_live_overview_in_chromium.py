"""Issue 42's live overview in a real browser, on this stack's Django, with a real
``runconsumer`` producing the numbers: the page shows them in a table and two labelled
charts, and refreshes them in place (no reload) when more messages are handled. The
screenshot is copied to docs/images/ (the admin guide shows it) by `make docs-images`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.operations.overview import activity
from tests.acceptance.processes import runconsumer, stop, wait_for
from tests.acceptance.test_live_overview import PAYLOADS, SETTINGS
from tests.browser.test_admin_in_chromium import (
    Admin,
    _keep,
    create_operator,
    django_version_tag,
)

pytestmark = pytest.mark.django_db(transaction=True)

CARD = '.sqlqueue-activity-card[data-group="workers"][data-topic="accept.work"]'


def handled_here(count: int) -> bool:
    return any(s.group == "workers" and s.total.acked + s.total.dead_lettered == count
               for s in activity())


def published_in_the_hour(admin: Admin) -> str:
    return str(admin.driver.find_element(
        By.CSS_SELECTOR, f'{CARD} tr[data-series="published"] .sqlqueue-hour').text)


def chart_paint(browser: Chrome) -> tuple[str, str]:
    """The computed fill of the first chart's first text, and the published line's
    stroke."""
    return tuple(browser.execute_script(
        "var svg = document.querySelector('svg.sqlqueue-activity-chart');"
        "return [getComputedStyle(svg.querySelector('text')).fill,"
        " getComputedStyle(svg.querySelector('polyline')).stroke];"))


def test_the_live_overview_shows_and_refreshes_a_runner_s_numbers(
        live_server: Any, browser: Chrome, screenshots: Path) -> None:
    version = django_version_tag()
    create_operator()
    send_messages("accept.work", [OutgoingMessage(p, partition_key=f"k{i % 3}")
                                  for i, p in enumerate(PAYLOADS)])
    process = runconsumer("--group", "workers", settings=SETTINGS)
    try:
        wait_for(lambda: handled_here(11), timeout=60, what="the rollup's rows")
        admin = Admin(browser, live_server.url, screenshots)
        admin.log_in()
        admin.open("/admin/")
        admin.click_link("Live overview")
        card = browser.find_element(By.CSS_SELECTOR, CARD)
        # (Django's stylesheet writes a module's heading in capitals.)
        assert card.find_element(By.TAG_NAME, "h2").text.lower() == "workers on accept.work"
        assert published_in_the_hour(admin) == "11"
        for series, hour in (("acked", "9"), ("retried", "2"), ("dead-lettered", "2")):
            row = card.find_element(By.CSS_SELECTOR, f'tr[data-series="{series}"]')
            assert row.find_element(By.CSS_SELECTOR, ".sqlqueue-hour").text == hour, series
        assert card.find_element(By.CSS_SELECTOR,
                                 'tr[data-series="p95"] .sqlqueue-hour').text.endswith(" s")
        charts = card.find_elements(By.CSS_SELECTOR, "svg.sqlqueue-activity-chart")
        assert len(charts) == 2
        labels = [chart.get_attribute("aria-label") or "" for chart in charts]
        assert "11 published, 9 acked, 2 retried, 2 dead-lettered" in labels[0]
        assert "p50 and p95" in labels[1]
        texts = [" ".join(t.text for t in chart.find_elements(By.TAG_NAME, "text"))
                 for chart in charts]
        assert "minutes ago (database time)" in texts[0] and "messages per minute" in texts[0]
        assert "now" in texts[0] and "-60" not in texts[0] and "-45" in texts[0]
        assert "handler duration (s)" in texts[1]
        # Told apart without colour: each series its own line pattern, in the legend too.
        dashes = {line.get_attribute("stroke-dasharray") for line in
                  charts[0].find_elements(By.TAG_NAME, "polyline")}
        assert len(dashes) == 4
        assert "dead-lettered" in card.find_element(By.CLASS_NAME, "sqlqueue-legend").text
        _keep(admin, f"28-live-overview-{version}")

        # Trial F1: in the admin's dark theme (the theme toggle's choice), the charts'
        # text is the theme's light body text and the series take their lighter colours.
        browser.execute_script("document.documentElement.dataset.theme = 'dark';")
        assert chart_paint(browser) == ("rgb(238, 238, 238)", "rgb(100, 181, 246)")
        _keep(admin, f"28-live-overview-dark-{version}")
        browser.execute_script("document.documentElement.dataset.theme = 'light';")
        assert chart_paint(browser)[0] != "rgb(238, 238, 238)"

        # Trial F7: a shorter range redraws the axis (ticks every 5 minutes, not 15).
        admin.click_link("15 min")
        ticks = [t.text for t in browser.find_elements(
            By.CSS_SELECTOR, f"{CARD} svg.sqlqueue-activity-chart text[text-anchor=middle]")]
        assert "-5" in ticks and "-45" not in ticks
        assert "?minutes=15" in browser.current_url
        card = browser.find_element(By.CSS_SELECTOR, CARD)

        # More messages: the numbers change in place, without a reload.
        browser.execute_script("window.sqlqueueNotReloaded = true;")
        send_messages("accept.work", [OutgoingMessage({"n": n}) for n in range(4)])
        wait_for(lambda: handled_here(15), timeout=60, what="the new rows")
        WebDriverWait(browser, 40).until(lambda _: published_in_the_hour(admin) == "15")
        assert browser.execute_script("return window.sqlqueueNotReloaded") is True
        assert browser.find_element(By.ID, "sqlqueue-activity-updated").text.startswith(
            "updated ")
    finally:
        stop(process)
