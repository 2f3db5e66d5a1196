from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.acceptance.processes import stop


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Subprocesses a test starts; killed (and reaped) when it ends, whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # in case a test left it stopped
        stop(process)
