"""The tables of an in-memory queue database, and its transactions.

Rows are frozen dataclasses, replaced rather than changed, so that a copy of a table's
dict is a snapshot: a transaction (or a savepoint) keeps the copies it began with and
puts them back on rollback. One connection may hold a transaction open at a time: the
harness steps everything in one thread, and an interleaving of two open transactions is
not modelled (no isolation levels here), so it is refused rather than silently wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A row of queue_messages."""

    offset: int
    topic: str
    partition_key: str
    id: str
    payload: bytes
    metadata: str | None
    created_at: int
    published_at: int
    priority: int
    deliver_after: int
    consumer_group: str = ""
    failure_detail: str | None = None
    failed_at: int = 0
    failure_count: int = 0
    last_error: str = ""
    original_topic: str = ""


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """A row of queue_delivery_state."""

    acked: bool
    invisible_until: int
    retry_count: int = 0
    acked_at: int = 0
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A row of queue_partition_leases."""

    leased_by: str
    leased_at: int
    renewed_at: int
    generation: int


@dataclass(frozen=True, slots=True)
class WatermarkRow:
    """A row of queue_offsets."""

    offset_acked: int
    updated_at: int
    first_pending: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatRow:
    heartbeat_at: int
    deregistered_at: int = 0


@dataclass
class Tables:
    """Every table, keyed by its primary key. ``next_offset`` is the log's sequence: like
    an AUTO_INCREMENT or a SEQUENCE it is not given back by a rollback."""

    #: offset -> message, in offset order (a dict keeps insertion order; offsets grow)
    messages: dict[int, StoredMessage] = field(default_factory=dict)
    #: (topic, partition_key, id) -> offset (idx_topic_partition_id)
    message_ids: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: (group, topic, partition, offset) -> state
    states: dict[tuple[str, str, str, int], DeliveryRow] = field(default_factory=dict)
    #: (group, topic, partition) -> lease; ("", "", "") is the server record
    leases: dict[tuple[str, str, str], StoredLease] = field(default_factory=dict)
    watermarks: dict[tuple[str, str, str], WatermarkRow] = field(default_factory=dict)
    heartbeats: dict[tuple[str, str, str], HeartbeatRow] = field(default_factory=dict)
    #: (key_high, key_low) -> (offset, expires_at)
    idempotency: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    #: (group, topic) pauses; "" matches any
    pauses: set[tuple[str, str]] = field(default_factory=set)
    #: runner name -> (action, requested_by, requested_at, obeyed_at)
    runner_requests: dict[str, tuple[str, str, int, int]] = field(default_factory=dict)
    #: (group, topic, minute) -> column -> amount (queue_minute_stats; a row is replaced,
    #: never changed, as the frozen rows are)
    minute_stats: dict[tuple[str, str, int], dict[str, float]] = field(default_factory=dict)

    def copy(self) -> Tables:
        return Tables(**{f.name: type(getattr(self, f.name))(getattr(self, f.name))
                         for f in dataclasses.fields(self)})


class MemoryDatabase:
    """One database: its tables, its clock (the injected one: ``now_ms``), and which
    connection has a transaction open."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self.now_ms = now_ms
        self.tables = Tables()
        self.next_offset = 1
        self.holder: Any = None  # the connection with an open transaction, if any
        #: late commits a test makes (tests/engine/stepped_workload.py): offset -> when
        #: its publishing transaction began, while its row is held back. ``None``: the
        #: test makes none, every transaction commits in offset order.
        self.open_writers: dict[int, int] | None = None
        #: statements run, by name (what a test may assert on)
        self.statements: dict[str, int] = {}

    def allocate_offset(self) -> int:
        offset, self.next_offset = self.next_offset, self.next_offset + 1
        return offset

    def use(self, connection: Any, statement: str) -> Tables:
        """The tables, for ``connection``: refused while another one holds a transaction
        open (an interleaving this model does not isolate)."""
        if self.holder is not None and self.holder is not connection:
            raise InterleavedTransactions(
                f"{statement} on {connection!r} while {self.holder!r} has a transaction "
                "open: the in-memory database does not model concurrent transactions")
        self.statements[statement] = self.statements.get(statement, 0) + 1
        return self.tables


class InterleavedTransactions(AssertionError):
    """Two connections' transactions overlapped (see ``MemoryDatabase.use``)."""


class MemoryConnection:
    """What a DB-API connection is to Django: here, a transaction (a stack of snapshots)
    on a ``MemoryDatabase``."""

    def __init__(self, database: MemoryDatabase, name: str) -> None:
        self.database = database
        self.name = name
        self.autocommit = True
        self._began: Tables | None = None
        self._savepoints: list[tuple[str, Tables]] = []

    def __repr__(self) -> str:
        return f"<memory connection {self.name}>"

    def set_autocommit(self, autocommit: bool) -> None:
        self.autocommit = autocommit
        if autocommit and self._began is not None:
            self._end()  # what was left open is committed, as a server does
        elif not autocommit and self._began is None:
            self._begin()

    def _begin(self) -> None:
        self.database.use(self, "BEGIN")
        self._began = self.database.tables.copy()
        self.database.holder = self

    def _end(self) -> None:
        self._began = None
        self._savepoints.clear()
        if self.database.holder is self:
            self.database.holder = None
        if not self.autocommit:
            self._begin()  # the next transaction begins at once, as on a server

    def commit(self) -> None:
        self._end()

    def rollback(self) -> None:
        if self._began is not None:
            self.database.tables = self._began
        self._end()

    def savepoint(self, sid: str) -> None:
        self._savepoints.append((sid, self.database.tables.copy()))

    def savepoint_rollback(self, sid: str) -> None:
        while self._savepoints:
            name, tables = self._savepoints[-1]
            if name == sid:
                self.database.tables = tables.copy()
                return
            self._savepoints.pop()
        raise KeyError(sid)

    def savepoint_commit(self, sid: str) -> None:
        while self._savepoints:
            name, _ = self._savepoints.pop()
            if name == sid:
                return

    def close(self) -> None:
        """A connection closed mid-transaction: the server rolls it back."""
        if self._began is not None:
            self.rollback()
        if self.database.holder is self:
            self.database.holder = None

    def cursor(self) -> NoSql:
        return NoSql(self)


class NoSql:
    """The cursor: runs no SQL. ``MemoryStore`` answers every named statement itself;
    SQL reaching the cursor was run on it directly, not through the store."""

    rowcount = -1
    lastrowid = None
    description = None

    def __init__(self, connection: MemoryConnection) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Any = None) -> None:
        raise NotImplementedError(
            f"the in-memory database runs no SQL (run it through the store): {sql}")

    executemany = execute

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass
