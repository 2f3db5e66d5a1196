"""Issue 42's Task results page in a real browser, on this stack's Django: why a task
failed, how long it ran, its dead letter and back, and Retry with its confirmation. The
screenshots are copied to docs/images/ (the admin guide shows them) by `make docs-images`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec

pytest.importorskip("sqlqueue.integrations.tasks.compat",  # Django 5.2 without the backport
                    exc_type=ImportError)

from sqlqueue.integrations.tasks.models import Status, TaskRecord
from tests.browser.test_admin_in_chromium import (
    BREADCRUMBS_BOX,
    Admin,
    _keep,
    create_operator,
    django_version_tag,
)
from tests.integration.consuming_helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_task_is_retried_from_its_page(live_server: Any, browser: Chrome,
                                                 screenshots: Path) -> None:
    failed = tasks.needs_order.enqueue("ORD-404")
    for n in range(3):
        tasks.add.enqueue(n, n)
    drain(["tasks"])
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    version = django_version_tag()
    browser.set_window_size(1366, 900)
    try:
        admin.log_in()

        admin.open("/admin/sqlqueue/taskrecord/")
        assert "LookupError: no order ORD-404" in admin.text()
        scroll, client = browser.execute_script(
            "return [document.documentElement.scrollWidth,"
            " document.documentElement.clientWidth]")
        assert scroll <= client, f"Task results scroll sideways: {scroll} > {client}"
        inner, shown = browser.execute_script(
            "const r = document.querySelector('.results'); return [r.scrollWidth, r.clientWidth]")
        assert inner <= shown, f"the list scrolls sideways at 1366 px: {inner} > {shown}"
        durations = [cell.text for cell in
                     browser.find_elements(By.CSS_SELECTOR, "td.field-duration")]
        assert len(durations) == 4 and all(text.endswith(" s") for text in durations)
        stock = browser.execute_script(BREADCRUMBS_BOX)
        _keep(admin, f"21-task-results-{version}")

        admin.open(f"/admin/sqlqueue/taskrecord/{failed.id}/change/")
        # Trial F6: the attempts that failed alike are one entry, its traceback shown once.
        entries = browser.find_elements(By.CSS_SELECTOR, ".sqlqueue-task-error")
        assert len(entries) == 1 and "Attempts 1-3 (3 times the same error)" in entries[0].text
        assert entries[0].find_element(By.TAG_NAME, "pre").is_displayed()
        assert browser.find_element(By.ID, "sqlqueue-discard-task").is_displayed()
        admin.follow(browser.find_element(By.ID, "sqlqueue-task-dead-letter"))
        assert "no order ORD-404" in admin.text()  # the dead letter's page ...
        admin.follow(browser.find_element(By.ID, "sqlqueue-dead-letter-task"))
        assert "tests.testapp.tasks.needs_order" in admin.text()  # ... and back
        _keep(admin, f"22-failed-task-{version}")

        admin.follow(browser.find_element(By.ID, "sqlqueue-retry-task"))
        admin.wait.until(ec.presence_of_element_located(
            (By.ID, "sqlqueue-confirm-task-retry")))
        assert "Retry it?" in admin.text()
        assert browser.execute_script(BREADCRUMBS_BOX) == stock
        _keep(admin, f"23-retry-task-confirm-{version}")
        admin.submit("Yes, retry it")
        assert admin.success() == "Retried 1 task(s)."
        assert TaskRecord.objects.get(pk=failed.id).status == Status.READY
    finally:
        browser.set_window_size(1400, 1000)
