from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection


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
        pytest.skip("MySQL/MariaDB-specific behaviour; the SQLite run covers its own variant")
