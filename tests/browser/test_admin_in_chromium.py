"""The operator's admin in a real browser: log in, open every page, replay a dead letter,
retry a backing-off message, and keep a screenshot of each step."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import F
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

import sqlqueue
from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.models import DeadLetter, DeliveryState, PartitionLease
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain, drain_until_watermarks, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]
PASSWORD = "correct horse battery staple"
EVIL = "<script>alert('pwned')</script>"


def operator_scene(register: Callable[..., Any]) -> None:
    """What an operator finds on a bad day: billing keeps up; emails has dead letters,
    a message backing off, and nobody consuming any more; analytics hit a bug."""
    def billing(message: sqlqueue.Message) -> None:
        return None

    def emails(message: sqlqueue.Message) -> None:
        n = message.payload["n"]
        if n % 7 == 3:
            raise sqlqueue.Reject(f"mailbox of customer {n} does not exist")
        if n == 8:
            raise sqlqueue.Retry(delay=3600, reason="SMTP server busy")

    def analytics(message: sqlqueue.Message) -> None:
        if message.payload["n"] == 2:
            raise ValueError("cannot parse the order total: 'twelve'")

    register("orders", "billing", billing)
    register("orders", "emails", emails)
    register("orders", "analytics", analytics, max_attempts=1)
    sent = send_messages("orders", [
        OutgoingMessage({"n": n, "note": EVIL if n == 5 else f"order {n}"},
                        partition_key=f"customer-{n % 6:02}")
        for n in range(24)])
    heads = {m.partition_key: m.offset for m in sent}
    drain_until_watermarks("billing", heads)
    drain_until_watermarks("analytics", heads)
    drain(["emails"], max_messages=24)
    # Two billing workers hold the partitions; an emails worker died holding one.
    store = store_for(connection)
    with connection.cursor() as cursor:
        for worker, keys in (("web-1.4242", sorted(heads)[:3]), ("web-2.4711", sorted(heads)[3:])):
            store.heartbeat(cursor, "billing", "orders", worker)
            store.acquire_leases(cursor, "billing", "orders", keys, worker, 30_000)
        store.acquire_leases(cursor, "emails", "orders", ["customer-05"], "web-3.1999", 1)
    PartitionLease.objects.filter(leased_by="web-3.1999").update(
        lease_renewed_at=F("lease_renewed_at") - 120_000)  # two minutes without renewal


def gone(element: WebElement) -> bool:
    """Has the page of ``element`` been replaced? (``ec.staleness_of``, plus the error
    ChromeDriver sometimes gives instead of a stale reference while the browser swaps the
    document: "Node with given id does not belong to the document".)"""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error):
            return True
        raise
    return False


class Admin:
    """The browser, on the live server's admin, with a screenshot per step."""

    def __init__(self, driver: Chrome, base_url: str, screenshots: Path) -> None:
        self.driver, self.base_url, self.screenshots = driver, base_url, screenshots
        self.wait = WebDriverWait(driver, 15)

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)
        self.wait.until(ec.presence_of_element_located((By.ID, "content")))

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.screenshots / f"{name}.png"))

    def text(self) -> str:
        body = self.wait.until(ec.presence_of_element_located((By.TAG_NAME, "body")))
        return str(body.text)

    def follow(self, element: WebElement) -> None:
        """Click what leads to another page and wait for that page. A click returns before
        the browser navigates, so waiting for #content alone may find the old page's."""
        old_page = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        self.wait.until(lambda driver: gone(old_page))
        self.wait.until(ec.presence_of_element_located((By.ID, "content")))

    def click_link(self, text: str) -> None:
        self.follow(self.wait.until(ec.element_to_be_clickable((By.PARTIAL_LINK_TEXT, text))))

    def submit(self, value: str) -> None:
        self.follow(self.driver.find_element(
            By.CSS_SELECTOR, f'input[type="submit"][value="{value}"]'))

    def success(self) -> str:
        return str(self.wait.until(ec.presence_of_element_located(
            (By.CSS_SELECTOR, ".messagelist .success"))).text)

    def log_in(self) -> None:
        """As the operator (``create_operator``), through the real login form."""
        self.open("/admin/login/")
        self.driver.find_element(By.NAME, "username").send_keys("operator")
        self.driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        self.submit("Log in")

    def stock_breadcrumbs(self) -> Any:
        """The breadcrumbs box of a page Django draws itself (the dead letters list), for
        comparing ours with (``BREADCRUMBS_BOX``)."""
        self.open("/admin/sqlqueue/deadletter/")
        return self.driver.execute_script(BREADCRUMBS_BOX)


def create_operator() -> None:
    User.objects.create_superuser("operator", "ops@example.com", PASSWORD)


def django_version_tag() -> str:
    """For screenshot names: each supported Django draws the admin its own way."""
    import django

    return f"django-{django.VERSION[0]}.{django.VERSION[1]}"


def test_operator_walkthrough(live_server: Any, browser: Chrome, screenshots: Path,
                              register: Callable[..., Any]) -> None:
    operator_scene(register)
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)

    # Log in through the real form.
    admin.log_in()
    for entry in ("Consumer lag", "Dead letters", "Messages", "Subscribers and leases"):
        assert entry in admin.text()
    admin.shot("01-index")

    # The message log, and one message whose payload carries a script: shown, not run.
    admin.open("/admin/sqlqueue/queuemessage/")
    assert "customer-05" in admin.text()
    # What the page does not show, and why; what its search searches (issue 52, 53 F3).
    assert 'SQLQUEUE["RETENTION"]' in browser.find_element(
        By.ID, "sqlqueue-retention-note").text
    assert "Finds an offset (a number), a partition key or a message id" in admin.text()
    assert "messages" in browser.find_element(By.ID, "sqlqueue-result-count").text
    admin.shot("02-messages")
    admin.open("/admin/sqlqueue/queuemessage/?q=customer-05")
    admin.follow(admin.driver.find_elements(By.CSS_SELECTOR, "th.field-offset a")[-1])
    assert EVIL in admin.text()
    with pytest.raises(NoAlertPresentException):
        _ = browser.switch_to.alert
    admin.shot("03-message-detail")

    # Dead letters: the list, one traceback, then a replay through the action menu.
    admin.open("/admin/sqlqueue/deadletter/")
    assert "mailbox of customer 3 does not exist" in admin.text()
    admin.shot("04-dead-letters")
    before = DeadLetter.objects.count()
    admin.open("/admin/sqlqueue/deadletter/?consumer_group=analytics")
    admin.follow(admin.driver.find_elements(By.CSS_SELECTOR, "th.field-offset a")[0])
    assert "Traceback (most recent call last)" in admin.text()
    assert "ValueError: cannot parse the order total" in admin.text()
    admin.shot("05-dead-letter-detail")
    admin.open("/admin/sqlqueue/deadletter/")
    # It refreshes itself (issue 53): untouched, the rows are swapped for fresh ones, on
    # which selecting still works; once a row is selected, it refreshes no more.
    browser.execute_script("document.getElementById('result_list').dataset.served = 'yes'")
    browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                 "window.sqlqueueRefresh().then(() => done());")
    assert browser.execute_script(
        "return document.getElementById('result_list').dataset.served") is None
    assert "updated" in browser.find_element(By.ID, "sqlqueue-page-updated").text
    browser.find_elements(By.CSS_SELECTOR, "input.action-select")[0].click()
    assert browser.find_element(By.CSS_SELECTOR, ".action-counter").text.startswith("1 of")
    assert browser.execute_script(
        "document.activeElement.blur(); return window.sqlqueueRefresh() === undefined")
    Select(browser.find_element(By.NAME, "action")).select_by_value("replay")
    admin.follow(browser.find_element(By.CSS_SELECTOR, 'button[name="index"]'))
    assert admin.success() == "Replayed 1 dead letter(s)."
    assert DeadLetter.objects.count() == before - 1
    admin.shot("06-replayed")

    # Lag: the overview, then the emails group, which nobody consumes any more.
    admin.open("/admin/sqlqueue/consumerlag/")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.sqlqueue-strip")
    assert "STOP" in admin.text() or "WARN" in admin.text()
    admin.shot("07-lag-overview")
    admin.click_link("emails")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.sqlqueue-columns rect")
    admin.shot("08-lag-emails")

    # Retry now, with its confirmation.
    admin.click_link("retry now")
    assert "Yes, retry now" in browser.page_source
    admin.shot("09-retry-now-confirm")
    admin.submit("Yes, retry now")
    assert "will be delivered again now" in admin.success()
    admin.shot("10-retried")

    # Reset a position: the form, the confirmation.
    admin.click_link("reset position")
    browser.find_element(By.CSS_SELECTOR, 'input[value="to_head"]').click()
    admin.submit("Continue")
    assert "Are you sure?" in admin.text()
    admin.shot("11-reset-confirm")
    admin.click_link("Cancel")

    # Subscribers and leases.
    admin.open("/admin/sqlqueue/subscriberstatus/")
    assert "billing on orders: 2 live" in admin.text() and "fair split" in admin.text()
    assert "web-3.1999" in admin.text()  # the stale lease
    admin.shot("12-subscribers")


DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def test_why_and_dead_letter_buttons_at_laptop_width(
        live_server: Any, browser: Chrome, screenshots: Path,
        register: Callable[..., Any]) -> None:
    """Issue 16's admin at 1366 px: the dead-letter list without a horizontal scroll,
    Replay and Discard on a dead letter's page, the last error of a retrying message on
    its page and on its partition's row, pending on the overview. The screenshots are
    copied to docs/images/ (the guides show them) by `make docs-images`."""
    operator_scene(register)
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    browser.set_window_size(1366, 900)
    try:
        admin.log_in()
        _laptop_walkthrough(admin, browser)
    finally:
        browser.set_window_size(1400, 1000)


def _no_sideways_scroll(browser: Chrome, page: str) -> None:
    scroll, client = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"{page} scrolls sideways at 1366 px: {scroll} > {client}"


def _keep(admin: Admin, name: str) -> None:
    admin.shot(name)
    if os.environ.get("SQLQUEUE_REFRESH_DOCS_IMAGES"):  # `make docs-images`
        admin.driver.save_screenshot(str(DOCS_IMAGES / f"admin-{name}.png"))


def _laptop_walkthrough(admin: Admin, browser: Chrome) -> None:
    admin.open("/admin/sqlqueue/deadletter/")
    assert "mailbox of customer 3 does not exist" in admin.text()
    scroll, client = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"horizontal scroll at 1366 px: {scroll} > {client}"
    inner, shown = browser.execute_script(
        "const r = document.querySelector('.results'); return [r.scrollWidth, r.clientWidth]")
    assert inner <= shown, f"the list scrolls sideways at 1366 px: {inner} > {shown}"
    error = browser.find_elements(By.CSS_SELECTOR, "td.field-error_summary")[0]
    assert error.is_displayed() and error.location["x"] + error.size["width"] <= client
    _keep(admin, "13-dead-letters-1366")

    # Replay from the dead letter's own page, with its confirmation.
    admin.follow(browser.find_elements(By.CSS_SELECTOR, "th.field-offset a")[0])
    admin.wait.until(ec.presence_of_element_located((By.ID, "sqlqueue-replay-one")))
    assert browser.find_element(By.ID, "sqlqueue-discard-one").is_displayed()
    _keep(admin, "14-dead-letter-buttons")
    before = DeadLetter.objects.count()
    admin.follow(browser.find_element(By.ID, "sqlqueue-replay-one"))
    admin.wait.until(ec.presence_of_element_located((By.ID, "sqlqueue-confirm-replay")))
    assert "Replay it?" in admin.text()
    _keep(admin, "15-replay-one-confirm")
    admin.submit("Yes, replay it")
    assert admin.success() == "Replayed 1 dead letter(s)."
    assert DeadLetter.objects.count() == before - 1

    # Why is the emails message retrying? On the overview, its partition, its page.
    admin.open("/admin/sqlqueue/consumerlag/")
    assert browser.find_elements(By.CSS_SELECTOR, "td.sqlqueue-pending")
    _no_sideways_scroll(browser, "the lag overview")
    _keep(admin, "16-lag-overview-pending")
    admin.click_link("emails")
    error_cell = browser.find_element(By.CSS_SELECTOR, ".sqlqueue-last-error")
    assert "SMTP server busy" in error_cell.text
    _no_sideways_scroll(browser, "a subscription's lag page")
    _keep(admin, "17-lag-last-error")
    retrying = DeliveryState.objects.exclude(last_error="").get(consumer_group="emails")
    admin.open(f"/admin/sqlqueue/queuemessage/{retrying.message_offset}/change/")
    table = browser.find_element(By.ID, "sqlqueue-delivery")
    assert "retrying" in table.text and "SMTP server busy" in table.text
    browser.execute_script("arguments[0].scrollIntoView()", table)
    _keep(admin, "18-message-delivery")


# The breadcrumbs bar as this browser draws it: a styled bar is one line tall with its
# crumbs side by side; markup of another Django's admin falls back to a numbered list,
# one crumb per line.
BREADCRUMBS_BOX = """
const bar = document.querySelector('.breadcrumbs');
const links = [...bar.querySelectorAll('a')];
return {height: Math.round(bar.getBoundingClientRect().height),
        background: getComputedStyle(bar).backgroundColor,
        one_line: links.every(a => Math.abs(a.getBoundingClientRect().top
                                            - links[0].getBoundingClientRect().top) < 2)};
"""


# How a button is drawn, for each selector: what an operator sees of it (its row too).
BUTTON_LOOKS = """
return [...arguments].map(selector => {
  const b = document.querySelector(selector), s = getComputedStyle(b);
  const box = b.getBoundingClientRect();
  return {height: Math.round(box.height), top: Math.round(box.top),
          padding: s.padding, font: s.fontSize + " " + s.fontWeight + " " + s.fontFamily,
          background: s.backgroundColor, color: s.color, radius: s.borderRadius,
          decoration: s.textDecorationLine};
});
"""


def test_custom_pages_are_styled_like_stock_pages_on_this_django(
        live_server: Any, browser: Chrome, screenshots: Path,
        register: Callable[..., Any]) -> None:
    """Issue 37: on every supported Django the custom pages' breadcrumbs look like those
    of a stock admin page of the same Django (one styled line), not an unstyled list. The
    screenshots of the lag overview and of a confirmation page, one per Django, are kept
    in docs/images by `make docs-images`."""
    operator_scene(register)
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    stock = admin.stock_breadcrumbs()
    assert stock["one_line"]
    for page in ("/admin/sqlqueue/consumerlag/", "/admin/sqlqueue/subscriberstatus/",
                 "/admin/sqlqueue/schedulestate/",
                 "/admin/sqlqueue/consumerlag/subscription/?group=emails&topic=orders"):
        admin.open(page)
        assert browser.execute_script(BREADCRUMBS_BOX) == stock, page
    # Trial F8: the lag subscription page's Pause button and "Retry all" link look alike
    # (same box, font, colours; neither underlined) and stand in one row.
    looks = browser.execute_script(BUTTON_LOOKS, "#sqlqueue-pause", "#sqlqueue-retry-all")
    assert looks[0] == looks[1], looks
    assert looks[0]["decoration"] == "none"
    version = django_version_tag()
    admin.open("/admin/sqlqueue/consumerlag/")
    _keep(admin, f"19-lag-overview-{version}")
    # A confirmation page of a repair, the other kind of custom page.
    admin.open("/admin/sqlqueue/consumerlag/retry-now/?group=emails&topic=orders")
    assert browser.execute_script(BREADCRUMBS_BOX) == stock
    _keep(admin, f"20-retry-now-confirm-{version}")
