"""Issue 42's runner control in a real browser, on this stack's Django, against a real
``runconsumer``: the Subscribers page lists it, "drain and stop" asks first, and the
process exits within one renew interval. The screenshots are copied to docs/images/ (the
admin guide shows them) by `make docs-images`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from sqlqueue.operations.runners import live_runners
from tests.acceptance.processes import FAST_LEASES, runconsumer, stop, wait_for
from tests.browser.test_admin_in_chromium import (
    BREADCRUMBS_BOX,
    Admin,
    _keep,
    create_operator,
    django_version_tag,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_runner_is_asked_to_drain_and_stop(live_server: Any, browser: Chrome,
                                             screenshots: Path) -> None:
    version = django_version_tag()
    create_operator()
    process = runconsumer("--group", "workers", "--name", "web-1.4242", settings=FAST_LEASES)
    try:
        wait_for(lambda: "web-1.4242" in live_runners(), what="the runner's heartbeat")
        admin = Admin(browser, live_server.url, screenshots)
        admin.log_in()
        stock = admin.stock_breadcrumbs()

        admin.open("/admin/sqlqueue/subscriberstatus/")
        runners = browser.find_element(By.ID, "sqlqueue-runners")
        assert "web-1.4242" in runners.text and "stop at once" in runners.text
        _keep(admin, f"24-runners-{version}")
        admin.follow(runners.find_element(By.CSS_SELECTOR, "a.sqlqueue-drain-runner"))
        admin.wait.until(ec.presence_of_element_located(
            (By.ID, "sqlqueue-confirm-stop-runner")))
        assert "Ask runner web-1.4242 to drain and stop?" in admin.text()
        assert browser.execute_script(BREADCRUMBS_BOX) == stock
        _keep(admin, f"25-drain-runner-confirm-{version}")
        admin.submit("Yes, drain and stop")
        assert "Asked runner web-1.4242 to drain and stop" in admin.success()
        browser.execute_script("window.sqlqueueNotReloaded = true;")
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert "web-1.4242: the user 'operator' asked this runner to drain and stop" in err
        assert LogEntry.objects.get().user.username == "operator"
        # Trial F16: the page refreshes itself, and the runner stays listed as stopped,
        # with who asked (it said goodbye: no more buttons).
        stopped = WebDriverWait(browser, 40).until(lambda _: browser.find_elements(
            By.CSS_SELECTOR, '.sqlqueue-stopped-runner[data-runner="web-1.4242"]'))
        assert "stopped: asked to drain and stop by operator at" in stopped[0].text
        assert not stopped[0].find_elements(By.CSS_SELECTOR, "a.sqlqueue-drain-runner")
        assert browser.execute_script("return window.sqlqueueNotReloaded") is True
        _keep(admin, f"29-runner-stopped-{version}")
    finally:
        stop(process)
