"""sqlqueue's pytest plugin (issue 38), in a pytest run of its own on a tiny project:
the fixtures work under pytest-django, in transactional tests too, and the plugin is
inert without pytest-django (no settings needed, no fixtures offered)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.database_independent  # its project's own SQLite (Makefile)
PLUGIN = "sqlqueue.testing.pytest_plugin"

SETTINGS = """
SECRET_KEY = "not secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "sqlqueue", "shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.sqlite3",
                         "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}
"""

CONSUMERS = """
import sqlqueue

handled = []

@sqlqueue.consumer("orders.created", group="billing")
def charge(message):
    handled.append(message.payload)
    if message.payload.get("fail"):
        raise RuntimeError("not yet")
"""

TESTS = """
import pytest
from sqlqueue import send_message
from sqlqueue.testing import advance_clock, clock_offset_ms
from shop import consumers


@pytest.mark.django_db
def test_run_and_capture(sqlqueue_run, sqlqueue_captured):
    consumers.handled.clear()
    send_message("orders.created", {"n": 1})
    assert [m.payload for m in sqlqueue_captured] == [{"n": 1}]
    report = sqlqueue_run(group="billing")
    assert (report.acked, report.retried, report.dead_lettered) == (1, 0, 0)
    assert consumers.handled == [{"n": 1}]


@pytest.mark.django_db(transaction=True)
def test_transactional(sqlqueue_run):
    consumers.handled.clear()
    send_message("orders.created", {"fail": True})
    assert sqlqueue_run().retried == 1
    advance_clock(60)
    assert sqlqueue_run().retried == 1  # its second attempt, due once the clock moved


def test_the_clock_was_set_back():
    assert clock_offset_ms() == 0
"""


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in ``project``, importing this checkout's sqlqueue. The plugin is named
    with -p unless the installed distribution declares it already (an editable install
    made before the entry point existed does not)."""
    installed = any(e.name == "sqlqueue" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", PLUGIN]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "consumers.py").write_text(textwrap.dedent(CONSUMERS))
    (tmp_path / "settings.py").write_text(textwrap.dedent(SETTINGS))
    (tmp_path / "test_shop.py").write_text(textwrap.dedent(TESTS))
    return tmp_path


def test_the_fixtures_work_under_pytest_django(project: Path) -> None:
    result = run_pytest(project, "--ds=settings", "-p", "django")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_without_pytest_django_the_plugin_is_inert(project: Path) -> None:
    (project / "test_shop.py").write_text(textwrap.dedent("""
        def test_plain():
            assert True

        def test_wants_the_fixture(sqlqueue_run):
            pass
    """))
    result = run_pytest(project, "-p", "no:django")
    assert "1 passed" in result.stdout, result.stdout + result.stderr
    assert "fixture 'sqlqueue_run' not found" in result.stdout


def test_the_entry_point_is_declared() -> None:
    """From the checkout: setup.cfg declares it. From the built wheel (.ci/test-wheel runs
    a copy of the tests with no setup.cfg beside them): the installed distribution does."""
    if os.environ.get("SQLQUEUE_EXPECT_INSTALLED"):
        installed = {e.name: e.value for e in entry_points(group="pytest11")}
        assert installed.get("sqlqueue") == PLUGIN, installed
        return
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = config["options.entry_points"]["pytest11"].split("\n")
    assert f"sqlqueue = {PLUGIN}" in [line.strip() for line in declared]
