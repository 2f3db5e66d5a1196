"""The Django executor, one module per vendor; ``dialect_for()`` picks the right one
(the layers above reach it through ``sqlqueue.storage.store()``)."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.storage.sql.base import Dialect, MessageRow

SUPPORTED_VENDORS = ("mysql", "postgresql", "sqlite")


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """The statements for ``connection``'s database; cached on the connection object."""
    dialect: Dialect | None = getattr(connection, "_sqlqueue_dialect", None)
    if dialect is None:
        if not isinstance(connection, BaseDatabaseWrapper):
            # django.db.connection, a proxy to whichever connection the *calling* thread
            # has: the dialect, kept on this thread's connection, must hold that one.
            from django.db import connections

            connection = connections[connection.alias]
        # A backend may bring its statements with it: the in-memory database the
        # engine's unit tests run on (tests/engine/memory) has no SQL to run.
        own_store = getattr(connection, "sqlqueue_store", None)
        if own_store is not None:
            dialect = own_store()
        elif connection.vendor == "mysql":
            from sqlqueue.storage.sql.mysql import MySQLDialect

            dialect = MySQLDialect(connection)
        elif connection.vendor == "postgresql":
            from sqlqueue.storage.sql.postgresql import PostgreSQLDialect

            dialect = PostgreSQLDialect(connection)
        elif connection.vendor == "sqlite":
            from sqlqueue.storage.sql.sqlite import SQLiteDialect

            dialect = SQLiteDialect(connection)
        else:
            raise ConfigurationError(
                f"sqlqueue supports MySQL, MariaDB, PostgreSQL and SQLite; database "
                f"{connection.alias!r} is {connection.vendor}."
            )
        connection._sqlqueue_dialect = dialect  # type: ignore[attr-defined]
    return dialect


__all__ = ["SUPPORTED_VENDORS", "Dialect", "MessageRow", "dialect_for"]
