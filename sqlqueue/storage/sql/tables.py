"""The rows the statements read and write, and the hooks every statement mixin relies
on (``Store`` and the vendor modules fill them in). The tables are named once, in
``sqlqueue.storage.statements.tables``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.statements import Statements
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite as DeadLetterWrite
from sqlqueue.storage.statements.delivery import OutcomeWrite as OutcomeWrite
from sqlqueue.storage.statements.publishing import IdempotencyDigest as IdempotencyDigest
from sqlqueue.storage.statements.publishing import MessageKey as MessageKey
from sqlqueue.storage.statements.publishing import MessageRow as MessageRow


@dataclass(frozen=True, slots=True)
class FetchedRow:
    """A message row joined with this group's delivery state (None: never delivered)."""

    offset: int
    id: str
    payload: bytes
    metadata: str | None
    created_at: int
    published_at: int
    priority: int
    deliver_after: int
    consumer_group: str
    failure_detail: str | None
    acked: bool | None
    invisible_until: int | None
    retry_count: int | None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


class VendorHooks:
    """What the statement mixins need from ``Store`` and its vendor subclasses."""

    #: the Django connection the store runs its statements on
    connection: BaseDatabaseWrapper
    quote: Any
    #: the vendor's shared statements (sqlqueue.storage.statements)
    sql: Statements
    now_ms_sql: str
    #: which server a statement ran on (``Vendor.server_identity_sql``; a class
    #: attribute of the store, so that a test can pretend another server answered)
    server_identity_sql = "''"
    locking_read_suffix: str

    def execute_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
        """Execute a statement of many rows' values (a subscriber's marks and outcomes,
        its fetches): the driver's own parameter binding, but on MySQL."""
        cursor.execute(sql, params)

    def last_inserted_offset(self, cursor: CursorWrapper) -> int:
        """The offset the INSERT just run (with ``returning_offset_sql``) allocated."""
        return int(cursor.lastrowid)

    def partition_heads(self, cursor: CursorWrapper, topic: str) -> dict[str, int]:
        """``partition_heads`` (``sql/vendors.py``): partition -> newest offset."""
        raise NotImplementedError

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        """The vendor's upsert (``sqlqueue.storage.statements.vendors.Vendor``)."""
        return self.sql.upsert_clause(key, assignments, table)

