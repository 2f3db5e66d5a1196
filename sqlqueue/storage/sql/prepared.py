"""The one-message INSERT prepared in a PostgreSQL session.

Parsing and planning ``store_messages`` of one row costs the server about 0.2 ms, some
40 % of what the statement costs it in all (``pgbench``, ``synchronous_commit`` off:
0.55 ms unprepared, 0.31 prepared): the table's three indexes, checks and identity make
even a one-row plan work. Django binds parameters on the client and never prepares
(``prepare_threshold`` is None unless ``OPTIONS`` sets it), so a connection that
publishes again and again would pay it every time. Here the statement is prepared with
SQL's ``PREPARE`` once a session has run it ``PREPARE_AFTER`` times, and a publish then
sends ``EXECUTE name(values)``: still one statement through Django's cursor (logged,
counted, wrapped like any other), parsed in microseconds.

A prepared statement belongs to one server session, so it is only safe where the
connection keeps one. Behind a transaction-mode pooler (PgBouncer, RDS Proxy, ...) the
next transaction may run on a session that never prepared it. Every such pooler answers
the connection's startup with a cancel key of its own, so the process id it reports
differs from the ``pg_backend_pid()`` of the session behind: sqlqueue reads both once
per connection and prepares nothing when they differ. ``SQLQUEUE["PREPARED_PUBLISH"] =
False`` turns the whole thing off.

``DISCARD ALL`` or ``DEALLOCATE ALL`` run by the application on a connection also drops
the statement. The next publish then fails with SQLSTATE 26000; outside a transaction it
is stored by the plain INSERT at once, inside one the caller's transaction is lost like
after any error, and the session prepares again later.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: a session prepares a statement once it has run it this many times (psycopg's own
#: default threshold): a connection that publishes once pays nothing more
PREPARE_AFTER = 5
#: SQLSTATE invalid_sql_statement_name: EXECUTE of a statement the session lacks
STATEMENT_GONE = "26000"
Variant = tuple[bool, bool]  # (skip_stored, wake)


def statement_name(variant: Variant) -> str:
    """The name the session prepares ``variant`` of the one-message INSERT under."""
    skip_stored, wake = variant
    return "sqlqueue_store_message" + ("_skip" if skip_stored else "") + (
        "_wake" if wake else "")


class PreparedSession:
    """What one server session (one driver connection) has prepared of sqlqueue's
    statements, and how often it ran those it has not."""

    def __init__(self) -> None:
        self.runs: Counter[Variant] = Counter()
        self.prepared: set[Variant] = set()
        #: the connection reaches its server session directly (None: not read yet)
        self.direct: bool | None = None

    def due(self, variant: Variant) -> bool:
        """Count a run of ``variant`` not prepared yet: is it time to prepare it?"""
        if self.direct is False:
            return False
        self.runs[variant] += 1
        return self.runs[variant] >= PREPARE_AFTER

    def forget(self) -> None:
        """The session lost its statements (``DISCARD ALL``): prepare them again later."""
        self.prepared.clear()
        self.runs.clear()


def session_statements(driver_connection: Any) -> PreparedSession:
    """The ``PreparedSession`` of a psycopg connection, kept on it: it lives as long
    as the server session it describes (also across Django connections of a pool)."""
    state: PreparedSession | None = getattr(driver_connection, "_sqlqueue_statements", None)
    if state is None:
        state = PreparedSession()
        driver_connection._sqlqueue_statements = state
    return state
