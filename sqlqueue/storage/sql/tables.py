"""The rows the statements read and write, and the hooks every statement mixin relies
on (``Dialect`` and the vendor modules fill them in). The tables are named once, in
``sqlqueue.storage.statements.tables``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.statements import Statements

MessageKey = tuple[str, str]  # (partition_key, id) within one topic
#: (key_high, key_low): the 128-bit digest of (topic, partition_key, id), see
#: sqlqueue.publishing.messages.idempotency_digest
IdempotencyDigest = tuple[int, int]


class MessageRow(NamedTuple):
    """One validated message, ready for ``INSERT`` (see sqlqueue.publishing).

    A named tuple rather than a dataclass: publishing makes one per message, and a
    tuple is built several times faster."""

    topic: str
    partition_key: str
    id: str
    payload: bytes
    metadata: str | None  # JSON text, or None for an empty map (the RFC stores NULL)
    published_at: int  # epoch ms, publisher's clock
    priority: int
    delay_ms: int | None  # deliver_after = database now + delay_ms ...
    deliver_at_ms: int  # ... or this absolute epoch ms when delay_ms is None (0 = at once)
    #: the id is a fresh UUID4 made by sqlqueue, so it cannot already be stored
    fresh_id: bool = False

    @property
    def key(self) -> MessageKey:
        return (self.partition_key, self.id)


# =========================================================================================
# Consuming: the statements a subscriber runs. Each is named after what it does; the
# method docstrings say which index serves it.
# =========================================================================================



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


@dataclass(frozen=True, slots=True)
class OutcomeWrite:
    """The new delivery state of one message after its handler ran."""

    partition_key: str
    offset: int
    acked: bool
    invisible_until: int
    last_error: str = ""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


class VendorHooks:
    """What the statement mixins need from ``Dialect`` and its vendor subclasses."""

    quote: Any
    #: the vendor's shared statements (sqlqueue.storage.statements)
    sql: Statements
    now_ms_sql: str
    #: which server a statement ran on: the same text for every connection to one server,
    #: another for any other server (a promoted replica, another cluster node)
    server_identity_sql = "''"
    locking_read_suffix: str
    #: appended to an INSERT of one message whose offset ``last_inserted_offset`` reads
    returning_offset_sql = ""

    # Vendor hooks -------------------------------------------------------------------
    @property
    def message_clock_sql(self) -> str:
        """``created_at`` of a row copied into queue_messages (dead letter, replay): the
        database clock read as the vendor's write horizon needs it (sqlqueue.horizon)."""
        return self.now_ms_sql

    def execute_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
        """Execute a statement of many rows' values (a subscriber's marks and outcomes,
        its fetches): the driver's own parameter binding, but on MySQL."""
        cursor.execute(sql, params)

    def last_inserted_offset(self, cursor: CursorWrapper) -> int:
        """The offset the INSERT just run (with ``returning_offset_sql``) allocated."""
        return int(cursor.lastrowid)

    def upsert_clause(
        self, key: Sequence[str], assignments: dict[str, str], table: str = ""
    ) -> str:
        """The vendor's upsert (``sqlqueue.storage.statements.vendors.Vendor``)."""
        return self.sql.upsert_clause(key, assignments, table)

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """An INSERT of one row (``{values}``: its value list) that skips a stored ``key``."""
        q = self.quote
        return (f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) "
                f"VALUES ({{values}}) {self.sql.insert_if_absent_suffix(key)}")

    def delete_messages_upto_sql(self) -> str:
        raise NotImplementedError

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """``write_horizon``: what the database shows of open transactions, for
        ``sqlqueue.horizon.settled_before`` (None: no transaction can commit out of offset
        order on this database). Read inside a started transaction."""
        raise NotImplementedError
