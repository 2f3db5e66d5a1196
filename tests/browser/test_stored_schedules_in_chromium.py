"""Issue 42's stored schedules in a real browser, on this stack's Django: one is created
through its form (a bad cron refused first), a real ``runconsumer`` publishes its ticks,
and the Schedules page shows it beside the setting's, read-only. The screenshots are copied
to docs/images/ (the admin guide shows them) by `make docs-images`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from sqlqueue.models import QueueMessage, StoredSchedule
from tests.acceptance.processes import FAST_LEASES, runconsumer, stop, wait_for
from tests.browser.test_admin_in_chromium import (
    BREADCRUMBS_BOX,
    Admin,
    _keep,
    create_operator,
    django_version_tag,
)

pytestmark = pytest.mark.django_db(transaction=True)
SETTINGS_SCHEDULE = {"from-settings": {"topic": "accept.beats", "cron": "0 3 * * *"}}


def stored_ticks() -> int:
    return sum(1 for m in QueueMessage.objects.filter(topic="accept.beats")
               .values_list("metadata", flat=True) if (m or {}).get("schedule") == "heartbeat")


def test_a_stored_schedule_is_created_and_ticked(live_server: Any, browser: Chrome,
                                                 screenshots: Path) -> None:
    version = django_version_tag()
    create_operator()
    admin = Admin(browser, live_server.url, screenshots)
    admin.log_in()
    stock = admin.stock_breadcrumbs()

    admin.open("/admin/sqlqueue/storedschedule/add/")
    for name, value in (("name", "heartbeat"), ("cron", "*/1 * * 13 *"),
                        ("topic", "accept.beats"), ("payload", '{"ping": true}')):
        browser.find_element(By.NAME, name).send_keys(value)
    admin.submit("Save")
    assert "is not a 5-field cron expression" in admin.text()
    assert not StoredSchedule.objects.exists()
    cron = browser.find_element(By.NAME, "cron")
    cron.clear()
    browser.find_element(By.NAME, "every").send_keys("1")
    assert browser.execute_script(BREADCRUMBS_BOX) == stock
    _keep(admin, f"26-stored-schedule-{version}")
    admin.submit("Save")
    assert StoredSchedule.objects.get().entry == {
        "every": 1, "topic": "accept.beats", "payload": {"ping": True}}

    process = runconsumer("--group", "workers", "--name", "ticker",
                          settings={**FAST_LEASES, "SCHEDULES": SETTINGS_SCHEDULE})
    try:
        wait_for(lambda: stored_ticks() >= 2, timeout=60, what="two ticks of the schedule")
    finally:
        stop(process)
    from django.test import override_settings

    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULE}):
        admin.open("/admin/sqlqueue/schedulestate/")
        text = admin.text()
        assert "from-settings" in text and "settings (read-only)" in text
        assert "heartbeat" in text and "every 1s" in text and "schedule:heartbeat:" in text
        assert browser.execute_script(BREADCRUMBS_BOX) == stock
        _keep(admin, f"27-schedules-{version}")
