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
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert "web-1.4242: the user 'operator' asked this runner to drain and stop" in err
        assert LogEntry.objects.get().user.username == "operator"
        admin.open("/admin/sqlqueue/subscriberstatus/")  # it said goodbye: not listed
        assert all("web-1.4242" not in table.text for table in
                   browser.find_elements(By.ID, "sqlqueue-runners"))
    finally:
        stop(process)
