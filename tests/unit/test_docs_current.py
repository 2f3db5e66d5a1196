"""The docs say what the code does: the facts a new user found stale (issue 13) are
checked against the code, so that they cannot go stale again."""

from __future__ import annotations

import re
from pathlib import Path

from django.apps import apps

from sqlqueue.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11,
           "twelve": 12, "thirteen": 13}


def prose() -> dict[Path, str]:
    return {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}


def queue_tables() -> set[str]:
    return {m._meta.db_table for m in apps.get_app_config("sqlqueue").get_models()
            if not m._meta.proxy and m._meta.db_table.startswith("queue_")}


def test_no_page_promises_what_already_shipped() -> None:
    stale = [p.name for p, text in prose().items() if "later release" in text]
    assert stale == []


def test_the_number_of_tables_migrate_creates_is_the_number_of_queue_tables() -> None:
    readme = (ROOT / "README.md").read_text()
    claims = re.findall(r"creates the (\w+)", readme) + re.findall(
        r"migrate`? creates the (\w+)", readme)
    assert claims, "README says how many tables migrate creates"
    assert {NUMBERS[c] for c in claims} == {len(queue_tables())}, sorted(queue_tables())


def test_the_dead_letter_topic_example_uses_the_default_suffix() -> None:
    text = (ROOT / "docs" / "guides" / "dlq-triage.md").read_text()
    assert f"`orders{DEFAULTS['DLQ_SUFFIX']}`" in text


def test_every_security_promise_names_tests_that_exist() -> None:
    """SECURITY.md says only what tests prove: each promise names its tests (a file
    under tests/, then the tests in it), and every test named is defined in that file."""
    text = (ROOT / "SECURITY.md").read_text()
    promises = text.split("## What sqlqueue promises")[1].split("## What is outside")[0]
    bullets = promises.split("\n- ")[1:]
    assert len(bullets) >= 8
    missing = []
    for bullet in bullets:
        assert "Tests: " in bullet, bullet[:80]
        current = None
        for token in re.findall(r"([\w/]+\.py)|`(test_\w+)`", " ".join(bullet.split())):
            path, test = token
            if path:
                current = ROOT / "tests" / path
            elif current is None or f"def {test}(" not in current.read_text():
                missing.append((str(current), test))
    assert missing == []
