"""Issue 53's schedule pages in a real browser, on this stack's Django (5.2 or 6.1): the
stored schedule's task picked from the registered ``@task``s (F13, W1), an absurd value
shown beside its field (W4), each save landing on the Schedules page (F10), pause and
resume there, and the last message no longer linked once collected (F2); in the light and
the dark theme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from sqlqueue.models import QueueMessage, StoredSchedule
from sqlqueue.operations.schedules import run_schedule_now
from sqlqueue.operations.stored_schedules import save_stored_schedule
from tests.browser.test_admin_in_chromium import Admin, create_operator, django_version_tag

pytestmark = pytest.mark.django_db(transaction=True)
SCHEDULES = "/admin/sqlqueue/schedulestate/"

#: (text colour, background colour) of an element: the first opaque background up the tree
COLOURS = """
const element = arguments[0];
const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
let node = element, background = [0, 0, 0, 0];
while (node && node.nodeType === 1) {
  background = parse(getComputedStyle(node).backgroundColor);
  if (background.length === 3 || background[3] > 0) break;
  node = node.parentElement;
}
return [parse(getComputedStyle(element).color), background];
"""


def contrast(element: Any, browser: Chrome) -> float:
    """WCAG's contrast ratio of an element's text against its background."""
    colour, background = browser.execute_script(COLOURS, element)

    def luminance(rgb: list[float]) -> float:
        def channel(value: float) -> float:
            value /= 255
            return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4
        r, g, b = (channel(v) for v in rgb[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(colour), luminance(background)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def use_theme(admin: Admin, theme: str) -> None:
    """The admin's own theme switch (Django 4.2+) keeps the choice in localStorage."""
    admin.driver.execute_script(f"localStorage.setItem('theme', '{theme}')")
    admin.driver.refresh()
    admin.open(admin.driver.current_url.removeprefix(admin.base_url))
    assert admin.driver.execute_script(
        "return document.documentElement.dataset.theme") == theme


def test_a_task_is_picked_and_a_bad_value_is_shown_beside_its_field(
        live_server: Any, browser: Chrome, screenshots: Path) -> None:
    pytest.importorskip("sqlqueue.integrations.tasks.compat")
    version = django_version_tag()
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    admin.open("/admin/sqlqueue/storedschedule/add/")
    picker = Select(browser.find_element(By.NAME, "task"))
    offered = [option.get_attribute("value") for option in picker.options]
    assert "tests.testapp.tasks.add" in offered and "tests.testapp.tasks.send_email" in offered
    assert not any("import_canary" in value for value in offered)
    browser.find_element(By.NAME, "name").send_keys("adder")
    browser.find_element(By.NAME, "every").send_keys("1e308")
    picker.select_by_value("tests.testapp.tasks.add")
    browser.find_element(By.NAME, "args").send_keys("[1, 2]")
    admin.submit("Save")
    beside = browser.find_element(By.CSS_SELECTOR, ".field-every .errorlist")
    assert "ten years" in beside.text and "got 1e+308" in beside.text  # not 309 digits
    admin.shot(f"53-stored-schedule-error-beside-every-{version}")
    assert not StoredSchedule.objects.exists()
    every = browser.find_element(By.NAME, "every")
    every.clear()
    every.send_keys("60")
    assert Select(browser.find_element(By.NAME, "task")).first_selected_option \
        .get_attribute("value") == "tests.testapp.tasks.add"
    admin.submit("Save")
    assert browser.current_url.endswith(SCHEDULES)
    row = browser.find_element(By.XPATH, "//tr[td//a[text()='adder']]")
    assert "every 60s" in row.text and "task tests.testapp.tasks.add" in row.text
    assert StoredSchedule.objects.get().entry == {
        "every": 60, "task": "tests.testapp.tasks.add", "args": [1, 2]}
    admin.shot(f"53-schedules-after-save-{version}")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_schedules_page_pauses_and_tells_a_collected_message(
        live_server: Any, browser: Chrome, screenshots: Path, theme: str) -> None:
    version = django_version_tag()
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    tick = run_schedule_now("beat")
    QueueMessage.objects.filter(offset=tick.offset).delete()  # what GC does at RETENTION 0
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    admin.open(SCHEDULES)
    use_theme(admin, theme)
    nav = browser.find_element(By.ID, "nav-sidebar").text if browser.find_elements(
        By.ID, "nav-sidebar") else admin.text()
    assert "Editable schedules" not in nav
    row = browser.find_element(By.XPATH, "//tr[td//a[text()='beat']]")
    assert tick.message_id in row.text and "collected" in row.text
    assert not row.find_elements(By.CSS_SELECTOR, "a[href*='/queuemessage/']")
    collected = row.find_element(By.CSS_SELECTOR, ".sqlqueue-collected")
    assert "RETENTION" in (collected.get_attribute("title") or "")
    for element in (row.find_element(By.TAG_NAME, "td"), collected):
        assert contrast(element, browser) >= 4.5, (theme, element.text)
    admin.shot(f"53-schedules-collected-{theme}-{version}")
    admin.submit("Pause")
    assert "Paused: beat." in admin.success()
    assert StoredSchedule.objects.get().paused
    row = browser.find_element(By.XPATH, "//tr[td//a[text()='beat']]")
    assert "paused" in row.text
    resume = row.find_element(By.CSS_SELECTOR, 'input[value="Resume"]')
    assert contrast(resume, browser) >= 3, theme
    admin.follow(resume)
    assert not StoredSchedule.objects.get().paused
    admin.driver.execute_script("localStorage.removeItem('theme')")


#: left and right edges of the content column, the table, the "Add a schedule" button and
#: the last of the page's buttons, and how wide the page scrolls
EDGES = """
const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
const tools = document.querySelectorAll('.sqlqueue-schedules .object-tools li');
return {main: box(document.getElementById('content-main')),
        table: box(document.querySelector('.sqlqueue-schedules table')),
        add: box(document.getElementById('sqlqueue-add-schedule')),
        last: box(tools[tools.length - 1]),
        scroll: document.documentElement.scrollWidth, width: window.innerWidth};
"""


def test_the_schedules_table_and_buttons_keep_to_the_content_column(
        live_server: Any, browser: Chrome, screenshots: Path) -> None:
    """Trial F9: at 1366 px, long words (a message id, a time zone, a task path) pushed the
    table past the content column; "Add a schedule" was at the right on 5.2, at the left
    on 6.1. Now: within the column, and at the right, on both."""
    save_stored_schedule("nightly-report-for-all-customers", {
        "topic": "reports", "cron": "0 3 * * 1-5",
        "timezone": "America/Argentina/Buenos_Aires"})
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    for name in ("nightly-report-for-all-customers", "beat"):
        run_schedule_now(name)
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    browser.set_window_size(1366, 900)
    try:
        admin.open(SCHEDULES)
        edges = browser.execute_script(EDGES)
        admin.shot(f"53-schedules-1366-{django_version_tag()}")
    finally:
        browser.set_window_size(1400, 1000)
    (left, right) = edges["main"]
    assert edges["table"][1] <= right + 1, edges
    assert edges["scroll"] <= edges["width"], edges  # no sideways scroll
    assert abs(edges["last"][1] - right) <= 1, edges  # the buttons end at the right edge
    assert edges["add"][0] > (left + right) / 2, edges  # ... "Add a schedule" with them
