"""The statement layer: every hand-written statement the stores and the Spark data
source run, built once, without Django and without a connection (but what needs the live
connection: MySQL's values escaped inline, PostgreSQL's COPY stream).

Each statement is a named builder returning a ``Statement`` (SQL with ``%s``
placeholders, and its parameters) for one vendor. Two thin executors run them: the
Django stores (``sqlqueue.storage.sql``) and the Spark executors' own DB-API
connections (``sqlqueue.integrations.spark.connect``), which must not import Django.
tests/integration/test_statement_layer.py runs every builder against every database.
"""

from __future__ import annotations

from sqlqueue.storage.statements.browse import BrowseStatements, MySQLBrowse, PostgreSQLBrowse
from sqlqueue.storage.statements.bulk import BulkStatements, MySQLBulk, PostgreSQLBulk
from sqlqueue.storage.statements.dead_letters import (
    DeadLetterStatements,
    MySQLDeadLetters,
    PostgreSQLDeadLetters,
)
from sqlqueue.storage.statements.delivery import DeliveryStatements, PostgreSQLDelivery
from sqlqueue.storage.statements.export import ExportStatements
from sqlqueue.storage.statements.failover import FailoverStatements
from sqlqueue.storage.statements.membership import MembershipStatements
from sqlqueue.storage.statements.minute_stats import MinuteStatsStatements
from sqlqueue.storage.statements.operating import OperatingStatements, PostgreSQLOperating
from sqlqueue.storage.statements.postgresql import PostgreSQLVendor
from sqlqueue.storage.statements.publishing import (
    MySQLPublishing,
    PostgreSQLPublishing,
    PublishingStatements,
)
from sqlqueue.storage.statements.schedules import ScheduleStatements
from sqlqueue.storage.statements.sessions import (
    MySQLSessions,
    PostgreSQLSessions,
    SessionStatements,
)
from sqlqueue.storage.statements.vendors import (
    MySQLVendor,
    SQLiteVendor,
    Statement,
    Vendor,
)
from sqlqueue.storage.statements.watermarks import WatermarkStatements


class Statements(PublishingStatements, DeliveryStatements, WatermarkStatements,
                 MembershipStatements, OperatingStatements, ScheduleStatements,
                 SessionStatements, ExportStatements, BulkStatements, FailoverStatements,
                 MinuteStatsStatements, BrowseStatements, DeadLetterStatements):
    """Every shared statement; a vendor's hooks come first in its subclass's bases."""


class MySQLStatements(MySQLPublishing, MySQLBulk, MySQLSessions, MySQLBrowse, MySQLDeadLetters,
                      MySQLVendor, Statements):
    pass


class SQLiteStatements(SQLiteVendor, Statements):
    pass


class PostgreSQLStatements(PostgreSQLPublishing, PostgreSQLDelivery, PostgreSQLDeadLetters,
                           PostgreSQLBulk, PostgreSQLSessions, PostgreSQLBrowse,
                           PostgreSQLOperating, PostgreSQLVendor, Statements):
    pass


_BY_VENDOR: dict[str, Statements] = {
    "mysql": MySQLStatements(), "sqlite": SQLiteStatements(),
    "postgresql": PostgreSQLStatements(),
}


def statements_for(vendor: str) -> Statements:
    """The shared statements of ``vendor`` (a Django ``connection.vendor`` name)."""
    try:
        return _BY_VENDOR[vendor]
    except KeyError:
        raise ValueError(
            f"sqlqueue speaks mysql, postgresql and sqlite, not {vendor!r}") from None


__all__ = ["MySQLStatements", "PostgreSQLStatements", "SQLiteStatements", "Statement",
           "Statements", "Vendor", "statements_for"]
