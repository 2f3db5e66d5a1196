"""SQLite 3.35+ statements of the data source."""

from __future__ import annotations

from sqlqueue.integrations.spark.sql.base import Statements
from sqlqueue.storage.statements.vendors import SQLiteVendor


class SQLiteStatements(SQLiteVendor, Statements):
    placeholder = "?"
    # One writer at a time: BEGIN IMMEDIATE takes the write lock at once, so a writer
    # waits for another instead of failing halfway with "database is locked".
    begin_sql = "BEGIN IMMEDIATE"
    # A range of the log is read by rowid range, not by scanning every index entry of
    # the topic (which SQLite prefers when a topic is given).
    no_index = "+"
