"""The store: every vendor's named statements on one Django connection; the vendor
modules (``mysql``, ``postgresql``, ``sqlite``) fill in the differences.

Each subject's executor module runs the builders of the statement module of the same name
(``sql/<subject>.py`` runs ``statements/<subject>.py``): ``publishing``, ``delivery``,
``watermarks``, ``membership``, ``failover``, ``operating``, ``schedules``,
``minute_stats``, ``sessions``, ``vendors``. The rows and the mixins' hooks are in
``tables``.
"""

from __future__ import annotations

import re

from django.db import DatabaseError, IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.storage.sql.browse import BrowseAccess
from sqlqueue.storage.sql.dead_letters import DeadLetterAccess
from sqlqueue.storage.sql.delivery import DeliveryAccess
from sqlqueue.storage.sql.failover import FailoverAccess
from sqlqueue.storage.sql.membership import MembershipAccess
from sqlqueue.storage.sql.minute_stats import MinuteStatsAccess
from sqlqueue.storage.sql.operating import (
    DUES_PER_STATEMENT,
    PENDING_BRANCHES_PER_STATEMENT,
    OperatingAccess,
    PendingSummary,
)
from sqlqueue.storage.sql.publishing import PublishingAccess
from sqlqueue.storage.sql.schedules import ScheduleAccess
from sqlqueue.storage.sql.sessions import SessionAccess
from sqlqueue.storage.sql.tables import (
    DeadLetterWrite,
    FetchedRow,
    IdempotencyDigest,
    MessageKey,
    MessageRow,
    OutcomeWrite,
    VendorHooks,
)
from sqlqueue.storage.sql.vendors import VendorAccess
from sqlqueue.storage.sql.watermarks import WatermarkAccess
from sqlqueue.storage.statements import statements_for
from sqlqueue.storage.statements.tables import (
    FLOW_CONTROL_TABLE,
    GROUP_KEY,
    HEARTBEATS_TABLE,
    IDEMPOTENCY_TABLE,
    LEASES_TABLE,
    MESSAGE_TABLE,
    OFFSETS_TABLE,
    STATE_KEY,
    STATE_TABLE,
)

#: a vendor's error for a missing sqlqueue table (``Store.is_missing_queue_table``)
MISSING_QUEUE_TABLE = re.compile(
    r"""(?:table|relation) ['"`]?(?:\w+\.)?queue_\w+['"`]? (?:doesn't|does not) exist"""
    r"|no such table: (?:\w+\.)?queue_\w+", re.IGNORECASE)


class Store(PublishingAccess, DeliveryAccess, DeadLetterAccess, WatermarkAccess,
            MembershipAccess, FailoverAccess, OperatingAccess, ScheduleAccess, MinuteStatsAccess,
            SessionAccess, VendorAccess, BrowseAccess):
    """Named statements for one database vendor, bound to one connection."""

    vendor = ""
    #: SQL expression for the database clock in epoch milliseconds (one value per statement).
    now_ms_sql = ""
    #: appended to reads that must see the newest committed rows, not the snapshot
    locking_read_suffix = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.sql = statements_for(self.vendor)
        self.quote = connection.ops.quote_name

    def check_connection(self) -> None:
        """Refuse a connection that would store text wrongly, before anything is written
        through it (``ConfigurationError``). Nothing to check for most databases."""

    # -- errors ------------------------------------------------------------------------
    def is_lock_wait(self, error: BaseException) -> bool:
        """Did ``error`` end a wait for a lock (timeout, or chosen as a deadlock victim)?
        The transaction can be rolled back and tried again."""
        return False

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        """Did ``error`` come from ``idx_topic_partition_id`` (an idempotent-publish hit)?"""
        raise NotImplementedError

    @staticmethod
    def is_missing_queue_table(error: DatabaseError) -> bool:
        """Did ``error`` say that one of sqlqueue's tables does not exist (a database
        nobody migrated)? By its text, read without another statement: on PostgreSQL the
        failed statement has aborted the transaction. MySQL/MariaDB "Table 'x.queue_...'
        doesn't exist", PostgreSQL 'relation "queue_..." does not exist', SQLite "no such
        table: queue_..."."""
        first_line = str(error).split("\n", 1)[0]
        return MISSING_QUEUE_TABLE.search(first_line) is not None


__all__ = [
    "DUES_PER_STATEMENT",
    "FLOW_CONTROL_TABLE",
    "GROUP_KEY",
    "HEARTBEATS_TABLE",
    "IDEMPOTENCY_TABLE",
    "LEASES_TABLE",
    "MESSAGE_TABLE",
    "OFFSETS_TABLE",
    "PENDING_BRANCHES_PER_STATEMENT",
    "STATE_KEY",
    "STATE_TABLE",
    "DeadLetterWrite",
    "DeliveryAccess",
    "FetchedRow",
    "IdempotencyDigest",
    "MembershipAccess",
    "MessageKey",
    "MessageRow",
    "OperatingAccess",
    "OutcomeWrite",
    "PendingSummary",
    "Store",
    "VendorHooks",
]
