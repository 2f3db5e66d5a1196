"""Headless Chromium for the admin's browser tests: Debian's chromium and chromedriver
(installed by .ci/bootstrap), never a browser a tool downloads. Screenshots go to
``test-artifacts/screenshots`` (or ``$SQLQUEUE_SCREENSHOTS``), which git ignores."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    for program in (CHROMIUM, CHROMEDRIVER):
        if not os.access(program, os.X_OK):
            pytest.fail(f"{program} is missing: run .ci/bootstrap (it installs Debian's "
                        "chromium and chromium-driver).")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="sqlqueue-chromium-")
    # Without the background-networking flags Chromium keeps calling home, which this
    # machine's closed network refuses.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    folder = Path(os.environ.get("SQLQUEUE_SCREENSHOTS", ROOT / "test-artifacts" / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
