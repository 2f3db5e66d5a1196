"""Running ``manage.py`` (or a script) under settings made for one test: the paths a new
user meets first (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.acceptance.processes import ROOT, database_url


def write_settings(directory: Path, extra: str, name: str = "trial_settings") -> str:
    """A settings module: the test suite's settings, then ``extra`` (Python) on top."""
    (directory / f"{name}.py").write_text("from tests.settings import *  # noqa\n" + extra)
    return name


def manage(directory: Path, settings_module: str, *args: str,
           database: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``manage.py *args`` under ``settings_module`` (a module in ``directory``)."""
    return _run([sys.executable, "manage.py", *args], directory, settings_module,
                database, timeout)


def script(directory: Path, settings_module: str, code: str,
           database: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Python ``code`` after ``django.setup()`` under ``settings_module``."""
    program = "import django\ndjango.setup()\n" + code
    return _run([sys.executable, "-c", program], directory, settings_module, database,
                timeout)


def _run(command: list[str], directory: Path, settings_module: str, database: str | None,
         timeout: float) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ, "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": database or database_url(), "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)]),
    }
    environment.pop("SQLQUEUE_JSON", None)
    return subprocess.run(command, cwd=ROOT, env=environment, text=True,
                          capture_output=True, timeout=timeout, check=False)
