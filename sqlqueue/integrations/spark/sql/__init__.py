"""The data source's SQL, one module per vendor, without Django.

Spark executors cannot import Django. The statements every executor runs come from the
shared, Django-free layer (``sqlqueue.storage.statements``), which these classes extend
with what only the data source reads and writes (tests/spark/test_statements.py). Each
method returns a ``Statement``: the SQL with ``%s`` placeholders and its parameters.
"""

from __future__ import annotations

from sqlqueue.integrations.spark.sql.base import Statements
from sqlqueue.storage.statements import Statement


def statements_for(vendor: str) -> Statements:
    if vendor == "mysql":
        from sqlqueue.integrations.spark.sql.mysql import MySQLStatements

        return MySQLStatements()
    if vendor == "sqlite":
        from sqlqueue.integrations.spark.sql.sqlite import SQLiteStatements

        return SQLiteStatements()
    if vendor == "postgresql":
        from sqlqueue.integrations.spark.sql.postgresql import PostgreSQLStatements

        return PostgreSQLStatements()
    raise ValueError(
        f"sqlqueue's Spark source supports mysql, postgresql and sqlite, not {vendor!r}")


__all__ = ["Statement", "Statements", "statements_for"]
