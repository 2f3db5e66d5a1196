"""Running ``manage.py runconsumer`` subprocesses against the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
#: short leases so that fault tests take seconds: renew every 0.5 s, expire after 2 s
FAST_LEASES = {"LEASE_DURATION": 2, "LEASE_RENEW_INTERVAL": 0.5, "POLL_INTERVAL": 0.05}


def database_url() -> str:
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
    scheme, port = ("postgres", 5432) if connection.vendor == "postgresql" else ("mysql", 3306)
    return (f"{scheme}://{settings['USER']}{password}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or port}/{settings['NAME']}")


def runconsumer(*args: str, settings: dict[str, Any] | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                   "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1",
                   "SQLQUEUE_JSON": json.dumps(settings or {}), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "manage.py", "runconsumer", *args], cwd=ROOT, env=environment,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def wait_for(condition: Callable[[], bool], timeout: float = 30, what: str = "",
             interval: float = 0.05) -> float:
    """Poll ``condition`` every ``interval`` seconds until true; return how long it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)
    return time.monotonic() - started


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(30)
    for stream in (process.stdout, process.stderr):
        if stream:
            stream.close()
