"""The checks of a PostgreSQL database reached through a connection pooler (seen at check
time: its ``pg_backend_pid()`` differs from the pid the connection was told). The pool
mode and the pooler's version are not visible to a client, so these warn about what
breaks in transaction mode and before PgBouncer 1.21."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Warning
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.conf import QueueSettings
from sqlqueue.storage.sql.postgresql import reaches_server_directly
from sqlqueue.wakeups.postgresql import past_pooler_problem


def behind_pooler(cursor: Any, connection: BaseDatabaseWrapper) -> bool:
    """Whether a pooler stands between ``connection`` and its server (``cursor``: one of
    the connection's)."""
    return not reaches_server_directly(cursor, connection.connection.info.backend_pid)


def pooler_problems(connection: BaseDatabaseWrapper,
                    conf: QueueSettings) -> list[CheckMessage]:
    """What does not work through the connection pooler in front of ``connection``."""
    found = (listener_cannot_pass(connection, conf),  # W106
             binding_through_pooler(connection))  # W107
    return [message for message in found if message is not None]


def listener_cannot_pass(connection: BaseDatabaseWrapper,
                         conf: QueueSettings) -> CheckMessage | None:
    """sqlqueue.W106: a runner's wake-up listener would LISTEN through the pooler."""
    alias = connection.alias
    consumed = alias in conf.databases  # runners consume there (a replica: the admin reads)
    problem = (past_pooler_problem(alias)
               if consumed and conf.WAKEUPS and not conf.has_listen_alias(alias) else None)
    if problem is None:
        return None
    return Warning(
        f"Database {alias!r} is reached through a connection pooler and the wake-up "
        "listener has no alias of its own: a LISTEN through a transaction pool hears "
        "nothing, and the listener cannot reach the server behind the pooler directly "
        f"either ({problem}), so runners switch their listener off (with a warning) "
        "and poll.",
        hint=f"Add an alias that connects straight to PostgreSQL (or through a "
             f"session-mode pool) and set SQLQUEUE['WAKEUP_LISTEN_DATABASES'] = "
             f"{{{alias!r}: '<that alias>'}} (or {{{alias!r}: {alias!r}}} if this one is "
             "a session-mode pool); or SQLQUEUE['WAKEUPS'] = False.",
        id="sqlqueue.W106",
    )


def binding_through_pooler(connection: BaseDatabaseWrapper) -> CheckMessage | None:
    """sqlqueue.W107: psycopg's prepared statements through a transaction pool."""
    if not connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return None
    return Warning(
        f"Database {connection.alias!r} binds parameters on the server (OPTIONS"
        "['server_side_binding']) through a connection pooler: psycopg then prepares "
        "statements, which a transaction-mode PgBouncer older than 1.21 (or without "
        "max_prepared_statements) mixes up between clients ('prepared statement "
        "\"_pg3_N\" already exists'), failing publishes and consumer passes.",
        hint="Remove OPTIONS['server_side_binding'], or run PgBouncer 1.21+ with "
             "max_prepared_statements > 0 (then silence sqlqueue.W107 in "
             "SILENCED_SYSTEM_CHECKS).",
        id="sqlqueue.W107",
    )
