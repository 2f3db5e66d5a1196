from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.db import connection

# Every test process checks that one thread writes a partition's window
# (sqlqueue.consuming.partition.CHECK_WRITER_VARIABLE); the runners the tests start in
# subprocesses inherit it.
os.environ.setdefault("SQLQUEUE_CHECK_WRITER", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """.ci/test-wheel runs the tests against the installed wheel: make sure that is what
    they import, not a source tree that happens to be on the path."""
    if os.environ.get("SQLQUEUE_EXPECT_INSTALLED"):
        import sqlqueue

        assert "site-packages" in sqlqueue.__file__, (
            f"expected the installed wheel, imported {sqlqueue.__file__}")


#: what a test asks for when it uses the test database (of DATABASE_URL) or its vendor
TEST_DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server",
                          "db_url", "mysql_only", "server_database"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tier markers follow the folder: tests/unit, tests/integration, tests/acceptance,
    tests/browser, tests/spark. The unit tier has no database: its outcome cannot depend
    on DATABASE_URL, so it is ``database_independent`` (run once, on SQLite: Makefile)."""
    for item in items:
        for tier in ("unit", "integration", "acceptance", "browser", "spark"):
            if f"/tests/{tier}/" in str(item.path):
                item.add_marker(getattr(pytest.mark, tier))
        if "/tests/unit/" in str(item.path):
            item.add_marker(pytest.mark.database_independent)
        refuse_database_independent_on_the_test_database(item)


def refuse_database_independent_on_the_test_database(item: pytest.Item) -> None:
    """A test that uses the test database depends on it: marked database_independent, the
    MariaDB/MySQL and PostgreSQL tiers would leave it out and lose it without a word."""
    if item.get_closest_marker("database_independent") is None:
        return
    uses = TEST_DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("django_db") is not None or uses:
        raise pytest.UsageError(
            f"{item.nodeid} is marked database_independent but uses the test database "
            f"({', '.join(sorted(uses)) or 'django_db'}): it must run on every database")


def stored_messages(topic: str | None = None) -> list[dict[str, Any]]:
    """Every stored message (optionally of one topic), oldest first, payload decoded."""
    from sqlqueue.models import QueueMessage

    rows = QueueMessage.objects.order_by("offset")
    if topic is not None:
        rows = rows.filter(topic=topic)
    result = []
    for row in rows.values():
        row["payload"] = json.loads(bytes(row["payload"]).decode("utf-8"))
        result.append(row)
    return result


@pytest.fixture
def mysql_only() -> None:
    if connection.vendor != "mysql":
        pytest.skip("MySQL/MariaDB-specific behaviour (SQLite and PostgreSQL have their own "
                    "variants where they share the behaviour)")


@pytest.fixture
def server_database() -> None:
    """For tests of concurrent writers on a database server: MySQL, MariaDB, PostgreSQL."""
    if connection.vendor == "sqlite":
        pytest.skip("needs concurrent writers on a database server; SQLite has one writer "
                    "at a time, and its own variant")
