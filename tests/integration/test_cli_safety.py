"""What the command line shows and accepts (issue 14: F4, F5, the --limit crash)."""

from __future__ import annotations

import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import sqlqueue
from sqlqueue import send_message
from tests.acceptance.processes import ROOT, database_url
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture
FORGED = "boom\x1b[2J\x1b]0;owned\x07 OK: nothing failed\x9b31m"


def test_dead_letter_errors_are_escaped_in_the_listing(register: Any) -> None:
    def reject(message: sqlqueue.Message) -> None:
        raise sqlqueue.Reject(FORGED)

    register("t", "g", reject)
    send_message("t", {})
    drain(["g"])
    out = StringIO()
    call_command("queue", "dead-letters", "list", stdout=out)
    listing = out.getvalue()
    assert "owned" in listing  # the text is there ...
    assert not any((ord(ch) < 32 and ch != "\n") or 127 <= ord(ch) < 160 for ch in listing)
    assert "boom\\x1b[2J\\x1b]0;owned\\x07 OK: nothing failed\\x9b31m" in listing


@pytest.mark.parametrize("limit", ["0", "-5", "10" * 12, "ten"])
def test_a_limit_out_of_range_is_a_usage_error(limit: str) -> None:
    with pytest.raises(CommandError, match="--limit is a whole number from 1 to 100,000"):
        call_command("queue", "dead-letters", "list", "--limit", limit, stdout=StringIO())


@pytest.mark.parametrize(("name", "problem"), [
    ("a\nb", "control character"),
    ("x" * 256, "the limit is 255 bytes"),
    ("", "must not be empty"),
])
def test_runconsumer_names_are_checked_like_topics(name: str, problem: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "runconsumer", "--name", name, "--until-empty"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url(),
             "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert problem in result.stderr
