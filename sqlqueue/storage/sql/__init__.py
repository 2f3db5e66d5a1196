"""The store (the Django executor of the named statements), one module per vendor;
``store_for()`` picks the right one (the layers above reach it through
``sqlqueue.storage.store()``)."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.storage.sql.base import MessageRow, Store

SUPPORTED_VENDORS = ("mysql", "postgresql", "sqlite")


def store_for(connection: BaseDatabaseWrapper) -> Store:
    """The statements for ``connection``'s database; cached on the connection object."""
    store: Store | None = getattr(connection, "_sqlqueue_kept_store", None)
    if store is None:
        if not isinstance(connection, BaseDatabaseWrapper):
            # django.db.connection, a proxy to whichever connection the *calling* thread
            # has: the store, kept on this thread's connection, must hold that one.
            from django.db import connections

            connection = connections[connection.alias]
        # A backend may bring its statements with it: the in-memory database the
        # engine's unit tests run on (tests/engine/memory) has no SQL to run.
        own_store = getattr(connection, "sqlqueue_store", None)
        if own_store is not None:
            store = own_store()
        elif connection.vendor == "mysql":
            from sqlqueue.storage.sql.mysql import MySQLStore

            store = MySQLStore(connection)
        elif connection.vendor == "postgresql":
            from sqlqueue.storage.sql.postgresql import PostgreSQLStore

            store = PostgreSQLStore(connection)
        elif connection.vendor == "sqlite":
            from sqlqueue.storage.sql.sqlite import SQLiteStore

            store = SQLiteStore(connection)
        else:
            raise ConfigurationError(
                f"sqlqueue supports MySQL, MariaDB, PostgreSQL and SQLite; database "
                f"{connection.alias!r} is {connection.vendor}."
            )
        connection._sqlqueue_kept_store = store  # type: ignore[attr-defined]
    return store


__all__ = ["SUPPORTED_VENDORS", "MessageRow", "Store", "store_for"]
