"""Storage: the models' tables and the hand-written SQL that runs against them.

``sqlqueue.storage.statements`` builds every statement, named, once and without Django
(tests/integration/test_statement_layer.py runs each on every database);
``sqlqueue.storage.sql`` runs them on a Django connection, one module per database vendor
(tests/integration/test_sql_statements.py, with the EXPLAIN checks). ``retry`` and
``chunks``: the deadlock-victim retry loop and the statement chunker publishing and the
Spark writer share. ``store()`` is the one way the rest of sqlqueue reaches a
database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from sqlqueue.storage.sql.base import Store


def store(using: str | BaseDatabaseWrapper | None = None) -> Store:
    """The one way to the database: the named statements run on connection ``using``
    (a database alias, a connection, or None for ``SQLQUEUE["DATABASE"]``), made once per
    connection and kept on it. Imported lazily: ``sqlqueue.storage.statements`` stays
    importable without Django."""
    # Made once and kept on the connection (store_for): every publish finds it here,
    # with an attribute lookup instead of an import statement on each call.
    kept: Store | None = getattr(using, "_sqlqueue_kept_store", None)
    if kept is not None:
        return kept
    from sqlqueue.storage.sql import store_for

    if using is None or isinstance(using, str):
        from django.db import connections

        from sqlqueue.conf import get_settings

        return store_for(connections[get_settings().DATABASE if using is None else using])
    return store_for(using)  # a connection: every publish's way (one import, not two)


__all__ = ["store"]
