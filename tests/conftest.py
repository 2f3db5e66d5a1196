from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.db import connection


def pytest_sessionstart(session: pytest.Session) -> None:
    """.ci/test-wheel runs the tests against the installed wheel: make sure that is what
    they import, not a source tree that happens to be on the path."""
    if os.environ.get("SQLQUEUE_EXPECT_INSTALLED"):
        import sqlqueue

        assert "site-packages" in sqlqueue.__file__, (
            f"expected the installed wheel, imported {sqlqueue.__file__}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tier markers follow the folder: tests/unit, tests/integration, tests/acceptance,
    tests/browser, tests/spark."""
    for item in items:
        for tier in ("unit", "integration", "acceptance", "browser", "spark"):
            if f"/tests/{tier}/" in str(item.path):
                item.add_marker(getattr(pytest.mark, tier))


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
