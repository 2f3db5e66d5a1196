"""The data source's SQL, one module per vendor, without Django.

Spark executors cannot import Django, so the statements the data source runs are built
here rather than by ``sqlqueue.storage.sql`` (whose dialects are bound to a Django
connection). The shapes follow the core's statements and are tested against the same
tables (tests/spark/test_statements.py). Each method returns a ``Statement``: the SQL
with ``%s`` placeholders and its parameters.
"""

from __future__ import annotations

from sqlqueue.integrations.spark.sql.base import Statement, Statements


def statements_for(vendor: str) -> Statements:
    if vendor == "mysql":
        from sqlqueue.integrations.spark.sql.mysql import MySQLStatements

        return MySQLStatements()
    if vendor == "sqlite":
        from sqlqueue.integrations.spark.sql.sqlite import SQLiteStatements

        return SQLiteStatements()
    raise ValueError(f"sqlqueue's Spark source supports mysql and sqlite, not {vendor!r}")


__all__ = ["Statement", "Statements", "statements_for"]
