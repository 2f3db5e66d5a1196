"""runconsumer inside an open transaction (issue 38): refused at once, before any
statement, with an error naming sqlqueue.testing; it never waits on the transaction's
locks (its handler threads, on other connections, would)."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext

import sqlqueue
from sqlqueue.consuming.registry import unregister

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md"


def refusal(**options: object) -> str:
    """Run runconsumer as a test would; return its error, checking that it ran no
    statement at all (so it cannot have waited on a lock)."""
    with CaptureQueriesContext(connection) as queries, \
            pytest.raises(CommandError) as refused:
        call_command("runconsumer", until_empty=True, stdout=StringIO(), **options)
    assert queries.captured_queries == []
    return str(refused.value)


class TestRefusedInsideATestCase(TestCase):
    def test_runconsumer_refuses_and_names_the_testing_toolkit(self) -> None:
        sqlqueue.send_message("refusal.work", {"n": 1})  # an uncommitted row, locked

        message = refusal()

        assert "inside an open transaction on database 'default'" in message
        assert "sqlqueue.testing.run_consumers()" in message

    def test_the_testing_guide_quotes_the_error(self) -> None:
        quoted = re.search(r"```text\nCommandError: (.*?)```", GUIDE.read_text(), re.S)
        assert quoted is not None
        assert " ".join(quoted.group(1).split()) == refusal()

    def test_also_with_the_options_a_test_would_give(self) -> None:
        assert "sqlqueue.testing" in refusal(group=["tasks"], max_messages=1,
                                             database="default")


class TestRefusedInsideAnAtomicBlock(TransactionTestCase):
    def test_an_atomic_block_around_call_command_is_refused(self) -> None:
        with transaction.atomic():
            assert "sqlqueue.testing" in refusal()

    def test_autocommit_turned_off_is_an_open_transaction_too(self) -> None:
        transaction.set_autocommit(False)
        try:
            assert "sqlqueue.testing" in refusal()
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)

    def test_outside_a_transaction_it_runs(self) -> None:
        handled: list[int] = []
        sqlqueue.consumer("refusal.work", group="refusers")(
            lambda message: handled.append(message.offset))
        self.addCleanup(unregister, "refusers", "refusal.work")
        sent = sqlqueue.send_message("refusal.work", {"n": 1})

        call_command("runconsumer", group=["refusers"], until_empty=True, stdout=StringIO())

        assert handled == [sent.offset]
