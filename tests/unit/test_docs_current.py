"""The docs say what the code does: the facts a new user found stale (issue 13) are
checked against the code, so that they cannot go stale again."""

from __future__ import annotations

import re
from pathlib import Path

from django.apps import apps

from sqlqueue.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


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
