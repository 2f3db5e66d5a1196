"""The checks of a SQLite queue database, one function per check id."""

from __future__ import annotations

import sqlite3

from django.core.checks import CheckMessage, Warning
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.checks.versions import MIN_SQLITE, too_old


def check_sqlite(connection: BaseDatabaseWrapper) -> list[CheckMessage]:
    found = (too_old("SQLite", sqlite3.sqlite_version_info, MIN_SQLITE,
                     shown=sqlite3.sqlite_version),  # E102
             not_immediate(connection))  # W104
    return [message for message in found if message is not None]


def not_immediate(connection: BaseDatabaseWrapper) -> CheckMessage | None:
    """sqlqueue.W104: deferred transactions fail with 'database is locked' when a
    publisher and a consumer write at once."""
    mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") or "")
    if mode.upper() == "IMMEDIATE":
        return None
    return Warning(
        f"SQLite database {connection.alias!r} does not start transactions in IMMEDIATE "
        "mode: a publisher and a consumer writing at once fail with 'database is locked'.",
        hint=f"Set DATABASES[{connection.alias!r}]['OPTIONS']['transaction_mode'] = "
             "'IMMEDIATE' (Django 5.1+).",
        id="sqlqueue.W104",
    )
