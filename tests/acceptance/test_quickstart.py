"""README's Quickstart, copied verbatim into a new project and run (issue 37): each
fenced block in document order; a Python block whose first line is ``# <path>`` is
that file of the project (``: add at the end`` appends to it), a shell block is run line
by line. A newcomer who follows the section gets a consumed message, on whichever Django
this stack has (5.2 LTS on Python 3.11, 6.x on 3.12+)."""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sqlqueue
from tests.acceptance.processes import stop

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.database_independent  # its project's own SQLite (Makefile)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of README's "Quickstart" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart in your Django project", 1)[1].split("\n## ", 1)[0]
    return FENCE.findall(section)


def environment() -> dict[str, str]:
    """This Python's environment, less what the suite sets for its own project."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")
           and not key.startswith("SQLQUEUE_")}
    # The virtualenv's scripts (django-admin) first, as an activated virtualenv has them.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The sqlqueue this test imports (the wheel's, or this checkout's when the virtualenv
    # has another checkout installed in editable mode).
    env["PYTHONPATH"] = str(Path(sqlqueue.__file__).resolve().parents[1])
    return {**env, "PYTHONUNBUFFERED": "1"}


def run_line(line: str, cwd: Path, outputs: list[str]) -> Path:
    """Run one shell line of the Quickstart in ``cwd``; returns the directory after it."""
    for part in line.split("&&"):
        words = shlex.split(part, comments=True)
        if not words:
            continue
        if words[0] == "pip":  # this stack has the package installed (the wheel in CI)
            assert words[1] == "install" and words[2].startswith("django-sqlqueue"), part
            continue
        if words[0] == "cd":
            cwd = cwd / words[1]
            continue
        command = [sys.executable, *words[1:]] if words[0] == "python" else words
        if words[1:3] == ["manage.py", "runconsumer"] and "--until-empty" not in words:
            outputs.append(run_until_interrupted(command, cwd))
            continue
        done = subprocess.run(command, cwd=cwd, env=environment(), text=True,
                              capture_output=True, timeout=180, check=False)
        assert done.returncode == 0, f"{part.strip()}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        outputs.append(done.stdout + done.stderr)
    return cwd


def run_until_interrupted(command: list[str], cwd: Path) -> str:
    """The worker the Quickstart leaves running: up once its banner is printed, then
    stopped with Ctrl-C (SIGINT), which must end it cleanly."""
    process = subprocess.Popen(command, cwd=cwd, env=environment(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "runconsumer printed nothing within 60 s"
        first = process.stdout.readline()  # the banner's first line, printed at start
        assert first.startswith("django-sqlqueue "), first
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        return first + out + err
    finally:
        stop(process)


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    assert [language for language, _ in blocks] == ["sh", "python", "python", "python",
                                                    "python", "sh"]
    cwd, outputs = tmp_path, []
    for language, text in blocks:
        if language == "sh":
            for line in text.splitlines():
                cwd = run_line(line, cwd, outputs)
            continue
        header = text.splitlines()[0]
        assert header.startswith("# "), header
        path, _, how = header[2:].partition(":")
        target = cwd / path.strip()
        if "add at the end" in how:
            target.write_text(target.read_text(encoding="utf-8") + "\n" + text,
                              encoding="utf-8")
        else:
            target.write_text(text, encoding="utf-8")

    checked, *_ = [out for out in outputs if "System check identified" in out]
    assert "System check identified no issues" in checked, checked  # W104 included
    consumed = next(out for out in outputs if "acked" in out)
    assert "billing:orders.created: 1 acked, 0 retried, 0 dead-lettered" in consumed
    assert "    group 'billing' on topic 'orders.created'" in consumed  # the banner
    assert "paid" in outputs[outputs.index(consumed) + 1].split()
