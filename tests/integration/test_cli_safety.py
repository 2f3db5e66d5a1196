"""What the command line shows and accepts (issue 14: F4, F5, the --limit crash)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import sqlqueue
from sqlqueue import send_message
from sqlqueue.exceptions import ConfigurationError
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


# -- F4/N5: bidirectional overrides and other invisible characters -------------------------
#: Names as another program (or an older sqlqueue) may have stored them: a right-to-left
#: override that shows "evil\u202etxt.exe" as "evilexe.txt", zero-width characters, a
#: line separator, an isolate, and an escape sequence.
EVIL = "evil\u202etxt.exe\u200b\u2066\u2028\x1b[2J"


def _shown_raw(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on rather than show."""
    import unicodedata

    return [ch for ch in text if (unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")
                                  and ch != "\n")]


def _store_hostile_names() -> None:
    from sqlqueue.models import FlowControl, PartitionLease, PartitionOffset, QueueMessage

    QueueMessage.objects.create(topic=EVIL, partition_key=EVIL, id=EVIL, payload=b"{}",
                                metadata={EVIL: EVIL}, created_at=1, published_at=1)
    QueueMessage.objects.create(topic=EVIL + "_dlq", partition_key=EVIL, id="d",
                                payload=b"{}", created_at=1, published_at=1, failed_at=1,
                                failure_count=1, last_error=EVIL, original_topic=EVIL,
                                consumer_group=EVIL, failure_detail={"reason": EVIL})
    PartitionOffset.objects.create(consumer_group=EVIL, topic=EVIL, partition_key=EVIL,
                                   offset_acked=0, updated_at=1)
    PartitionLease.objects.create(consumer_group=EVIL, topic=EVIL, partition_key=EVIL,
                                  leased_by=EVIL, leased_at=1, lease_renewed_at=1)
    FlowControl.objects.create(consumer_group=EVIL, topic=EVIL, paused_at=1, paused_by=EVIL)


@pytest.mark.parametrize("verb", [
    ["status"], ["status", "--partitions"], ["pauses"], ["dead-letters", "list"],
    ["health"], ["schedules"],
])
def test_every_listing_escapes_invisible_and_control_characters(verb: list[str]) -> None:
    _store_hostile_names()
    out = StringIO()
    with contextlib.suppress(SystemExit):  # health exits non-zero: its output matters
        call_command("queue", *verb, stdout=out)
    shown = out.getvalue()
    assert _shown_raw(shown) == []
    if verb[0] in ("status", "pauses"):
        assert "evil\\u202etxt.exe\\u200b\\u2066\\u2028\\x1b[2J" in shown


def test_errors_printed_by_the_command_line_are_escaped() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "queue", "retry-now", EVIL, EVIL],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url(),
             "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "evil" in result.stderr
    assert _shown_raw(result.stderr) == []


@pytest.mark.parametrize("name", ["evil\u202etxt", "a\u200bb", "a\u2028b", "x\u2066y",
                                  "bom\ufeff"])
def test_names_with_invisible_characters_are_refused(name: str, register: Any) -> None:
    from sqlqueue.models import QueueMessage

    for kwargs in ({"topic": name}, {"partition_key": name}, {"id": name}):
        arguments = {"topic": "t", "payload": 1, **kwargs}
        with pytest.raises(sqlqueue.InvalidMessage, match="invisible character U\\+"):
            send_message(**arguments)
    with pytest.raises(ConfigurationError, match="invisible character"):
        register("t", name, lambda m: None)
    with pytest.raises(ConfigurationError, match="invisible character"):
        register(name, "g", lambda m: None)
    assert not QueueMessage.objects.exists()
    result = subprocess.run(
        [sys.executable, "manage.py", "runconsumer", "--name", name, "--until-empty"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url(),
             "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "invisible character" in result.stderr


# -- W7: look-alike names (blank characters, marks, spaces at the ends, NFD) ------------
@pytest.mark.parametrize(("name", "problem"), [
    ("orders\u3164", "U+3164 (HANGUL FILLER)"),
    ("orders\u115f", "U+115F (HANGUL CHOSEONG FILLER)"),
    ("orders\u2800", "U+2800 (BRAILLE PATTERN BLANK)"),
    ("ord\u00a0ers", "U+00A0 (NO-BREAK SPACE)"),
    ("ord\u3000ers", "U+3000 (IDEOGRAPHIC SPACE)"),
    ("orders\u0336", "combining mark U+0336"),
    ("orders\u034f", "U+034F (COMBINING GRAPHEME JOINER)"),
    ("orders\ufe0f", "combining mark U+FE0F"),
    ("orders\ue000", "U+E000 (a private-use character)"),
    ("orders\uffff", "U+FFFF (a noncharacter)"),
    ("orders ", "ends with whitespace"),
    (" orders", "begins with whitespace"),
    ("cafe\u0301", "composed form (NFC)"),
], ids=lambda value: ascii(value) if isinstance(value, str) else None)
def test_look_alike_names_are_refused(name: str, problem: str, register: Any) -> None:
    """Audit W7: a name that shows as another one (``orders\\u3164`` as ``orders``) is
    refused wherever a name is given: topic, partition key, id, consumer group."""
    from sqlqueue.models import QueueMessage

    for kwargs in ({"topic": name}, {"partition_key": name}, {"id": name}):
        with pytest.raises(sqlqueue.InvalidMessage, match=re.escape(problem)):
            send_message(**{"topic": "t", "payload": 1, **kwargs})
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        register("t", name, lambda m: None)
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        register(name, "g", lambda m: None)
    assert not QueueMessage.objects.exists()
