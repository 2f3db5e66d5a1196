"""The example project's own tests, which use sqlqueue.testing (issue 38), pass: with
Django's test runner (manage.py test) and with pytest and sqlqueue's fixtures. On a SQLite
file of their own (Django tests it in memory); the toolkit's tests cover every database."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.database_independent  # a SQLite file of its own (Makefile)


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def test_the_shop_tests_pass_under_djangos_runner(tmp_path: Path) -> None:
    result = run(["manage.py", "test", "example_project.shop", "--noinput"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Ran 8 tests" in result.stderr


def test_the_shop_tests_pass_under_pytest(tmp_path: Path) -> None:
    installed = any(e.name == "sqlqueue" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "sqlqueue.testing.pytest_plugin"]
    result = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
                  "--ds=example_project.settings", "example_project/shop/pytest_examples.py"],
                 tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_the_toolkit_refuses_the_shops_own_database(tmp_path: Path) -> None:
    """Audit W6: run_consumers() and advance_clock() typed into ``manage.py shell`` (here
    after setup_test_environment(), as Django's tutorial does in a shell) refuse the
    database the settings name, before connecting to it: they never run on production data."""
    code = ("from django.test.utils import setup_test_environment\n"
            "setup_test_environment()\n"
            "from sqlqueue.testing import NotATestDatabase, advance_clock, run_consumers\n"
            "for call in (lambda: advance_clock(60), lambda: run_consumers(group='billing')):\n"
            "    try:\n"
            "        call()\n"
            "    except NotATestDatabase as exc:\n"
            "        print('REFUSED', exc)\n")
    result = run(["manage.py", "shell", "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    database = str(tmp_path / "shop.sqlite3")
    refusals = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert [line.split(" refuses")[0] for line in refusals] == [
        "REFUSED advance_clock()", "REFUSED run_consumers()"], result.stdout
    assert all(f"the database {database!r} (alias 'default'), which Django's test setup "
               "did not create" in line for line in refusals), result.stdout
    assert not (tmp_path / "shop.sqlite3").exists()  # never connected to
