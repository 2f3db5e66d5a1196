"""Statements for PostgreSQL 14+ through psycopg 3.

``offset`` is a reserved word here too; every identifier goes through ``quote_name``.
Two clocks, both the server's:

* ``now_ms_sql`` is ``statement_timestamp()``: one value for the whole statement, as the
  other vendors' clocks are, so that a statement testing a lease's age in several places
  (``acquire_leases``) sees one answer;
* ``message_clock_sql``, the ``created_at`` of every row written into queue_messages, is
  ``clock_timestamp()`` read *after* the transaction has a transaction id: the order the
  exact write horizon rests on (``write_horizon``).

``acked`` and ``postponed`` are BOOLEAN columns (Django's BooleanField); the shared
statements treat them as truth values (``NOT acked``, ``FALSE``), which every vendor
accepts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import MessageRow, Store
from sqlqueue.storage.sql.prepared import (
    STATEMENT_GONE,
    Variant,
    session_statements,
    statement_name,
)
from sqlqueue.storage.statements import PostgreSQLStatements
from sqlqueue.storage.statements.postgresql import PostgreSQLVendor
from sqlqueue.storage.statements.publishing import WAKEUP_CHANNEL as WAKEUP_CHANNEL

#: SQLSTATEs of a lock wait given up: lock_not_available (lock_timeout),
#: deadlock_detected, serialization_failure
LOCK_WAIT_STATES = frozenset({"55P03", "40P01", "40001"})
UNIQUE_VIOLATION = "23505"
#: rows from which ``insert_messages`` writes with COPY rather than a multi-row INSERT:
#: below it its three more round trips (a savepoint, the offsets) outweigh what COPY saves
#: (docs/benchmarks.md, "Bulk publishing with COPY")
COPY_MIN_ROWS = 50
#: the builders, for connections without a store (the wake-up listener's)
STATEMENTS = PostgreSQLStatements()


def server_address(identity: str) -> tuple[str, int] | None:
    """(host, port) of a ``server_identity`` answer ('10.0.0.5:5432 started ...'); None
    when the session came in through a Unix socket (no address)."""
    address = identity.split(" started ", 1)[0]
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def reaches_server_directly(cursor: Any, driver_pid: int) -> bool:
    """Does the connection whose driver was told ``driver_pid`` at connect time reach
    its server session directly? Every connection pooler (PgBouncer, RDS Proxy, ...)
    answers the startup with a cancel key of its own, so the process id it reports
    differs from the ``pg_backend_pid()`` of the session behind."""
    cursor.execute(*STATEMENTS.server_session_pid())
    reached = cursor.fetchone()
    return reached is not None and int(reached[0]) == driver_pid


class DuplicateMessage(IntegrityError, SqlqueueError):
    """An ``insert_messages`` row whose (topic, partition_key, id) is stored already,
    inside a transaction.

    Raised by the store, not by the server: there the INSERT says ``ON CONFLICT DO
    NOTHING``, because on PostgreSQL a failed statement aborts the whole transaction,
    and publishing inside the caller's transaction must survive a duplicate."""


def _sqlstate(error: BaseException) -> str | None:
    """psycopg's SQLSTATE of ``error`` or of the driver error Django wrapped in it."""
    for candidate in (error, error.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


class PostgreSQLStore(Store):
    vendor = "postgresql"
    sql: PostgreSQLStatements
    now_ms_sql = PostgreSQLVendor.now_ms_sql
    locking_read_suffix = PostgreSQLVendor.locking_read_suffix
    server_identity_sql = PostgreSQLVendor.server_identity_sql
    probes_per_statement = 2_000  # the lag's probes (OperatingAccess), as arrays

    def last_inserted_offset(self, cursor: CursorWrapper) -> int:
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    @contextmanager
    def operator_reads(self, alias: str) -> Iterator[None]:
        """In a transaction whose ``jit`` is off (``set_jit``); inside the caller's
        transaction, its setting is put back after."""
        outer = connections[alias].in_atomic_block
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                cursor.execute(*self.sql.set_jit("off"))
                row = cursor.fetchone()
            yield
            if outer and row is not None and row[0] != "off":
                with connections[alias].cursor() as cursor:
                    cursor.execute(*self.sql.set_jit(row[0]))

    # -- insert_messages ---------------------------------------------------------------
    # -- wake-ups -----------------------------------------------------------------------
    notifies_wakeups = True
    narrows_fetches = True  # planning a UNION ALL of 16 fetches took 3-5 ms

    def notify_wakeup(self, cursor: CursorWrapper, topic: str) -> None:
        cursor.execute(*self.sql.notify_wakeup(topic))

    def notify_heartbeat(self, cursor: CursorWrapper) -> None:
        cursor.execute(*self.sql.notify_heartbeat())

    # COPY has no parameter limit: a chunk is bounded by max_statement_bytes, and the
    # rows of a chunk smaller than COPY_MIN_ROWS fit one INSERT's parameters.
    max_rows_per_insert = 5000

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow], *, wake: str | None = None,
        prepared: bool = False,
    ) -> list[int] | None:
        """Raises ``IntegrityError`` with nothing stored if any row is a duplicate, and
        the caller's transaction stays usable, as on the other vendors. From
        ``COPY_MIN_ROWS`` rows: ``copy_messages``.

        On PostgreSQL a failed statement aborts the transaction around it. So outside a
        transaction (autocommit: the statement is one) the plain INSERT fails on a
        duplicate as elsewhere; inside one, the INSERT skips stored rows, and if it
        skipped any, deletes the rows it stored beside them in the same transaction
        (no reader ever sees them) and raises ``DuplicateMessage``. Rows whose ids
        sqlqueue drew (``fresh_id``: UUIDv7s, never stored) need no skipping: the
        plain INSERT spares the server ``ON CONFLICT``'s speculative insertion (a
        second look into the unique index, a lock and a WAL record more per row)."""
        if len(rows) >= COPY_MIN_ROWS:
            copied = self.copy_messages(cursor, rows)
            if wake is not None:
                self.notify_wakeup(cursor, wake)
            return copied
        # connected: the cursor is open
        skip_stored = not self.connection.autocommit and not all(row.fresh_id for row in rows)
        self._store(cursor, rows, skip_stored=skip_stored, wake=wake is not None,
                    prepared=prepared)
        stored = cursor.fetchall()
        if skip_stored and len(stored) < len(rows):
            if stored:
                cursor.execute(*self.sql.delete_inserted_messages(
                    [int(stored_row[0]) for stored_row in stored]))
            raise DuplicateMessage("a message id is stored already")
        if len(rows) == 1:
            return [int(stored[0][0])]  # the one-row statements return the offset alone
        # By key, not by position: RETURNING promises no order.
        offsets = {(str(pk), str(mid)): int(offset) for offset, pk, mid, *_ in stored}
        return [offsets[row.key] for row in rows]

    def _store(self, cursor: CursorWrapper, rows: Sequence[MessageRow], *, skip_stored: bool,
               wake: bool, prepared: bool) -> None:
        """Run ``store_messages``; ``prepared``: for one row without a delay, as the
        statement prepared in the session once it is run often (``prepared.py``)."""
        name = self._prepared_insert(cursor, rows, (skip_stored, wake)) if prepared else None
        if name is None:
            cursor.execute(*self.sql.store_messages(rows, skip_stored=skip_stored, wake=wake))
            return
        try:
            cursor.execute(*self.sql.execute_stored_message(name, rows[0]))
        except DatabaseError as error:
            if _sqlstate(error) != STATEMENT_GONE:
                raise
            session_statements(self.connection.connection).forget()
            if not self.connection.get_autocommit():
                raise  # the caller's transaction is aborted: theirs to retry
            cursor.execute(*self.sql.store_messages(rows, skip_stored=skip_stored, wake=wake))

    def through_pooler(self, cursor: CursorWrapper) -> bool:
        """Read once per driver connection (``reaches_server_directly``)."""
        driver = self.connection.connection
        session = session_statements(driver)
        if session.direct is None:
            session.direct = reaches_server_directly(cursor, driver.info.backend_pid)
        return not session.direct

    def _prepared_insert(self, cursor: CursorWrapper, rows: Sequence[MessageRow],
                         variant: Variant) -> str | None:
        """The name of the session's prepared one-message INSERT of ``variant``, prepared
        now if it is due; None: run the plain statement (many rows, a delay, parameters
        bound on the server, where psycopg prepares by its own ``prepare_threshold``,
        a connection through a pooler, or not run often enough yet)."""
        if (len(rows) != 1 or rows[0].delay_ms is not None
                or self.connection.settings_dict["OPTIONS"].get("server_side_binding")):
            return None
        driver = self.connection.connection
        session = session_statements(driver)
        name = statement_name(variant)
        if variant in session.prepared:
            return name
        if not session.due(variant):
            return None
        if session.direct is None:
            session.direct = reaches_server_directly(cursor, driver.info.backend_pid)
            if not session.direct:
                return None
        skip_stored, wake = variant
        cursor.execute(*self.sql.prepare_stored_message(name, skip_stored=skip_stored,
                                                        wake=wake))
        session.prepared.add(variant)
        return name

    # -- copy_messages -----------------------------------------------------------------
    def copy_messages(self, cursor: CursorWrapper, rows: Sequence[MessageRow]) -> list[int]:
        """``insert_messages`` of a large batch: the offsets and the clock are read first
        (``reserve_offsets``), then the rows stream in through psycopg's ``copy()``,
        two to three times as fast as a multi-row INSERT for batches of 1,000.

        In a savepoint (a transaction of its own in autocommit): COPY has no ``ON
        CONFLICT``, so a duplicate fails the statement, and only rolling back to the
        savepoint keeps the caller's transaction usable. Then ``DuplicateMessage`` is
        raised with nothing stored, and the caller reads the stored offsets and copies
        the other rows again. Offsets taken from the sequence are never given back (a
        failed INSERT leaves the same gap)."""
        with transaction.atomic(using=self.connection.alias):
            cursor.execute(*self.sql.reserve_offsets(len(rows)))
            reserved = cursor.fetchone()
            assert reserved is not None
            now_ms, offsets = int(reserved[0]), sorted(int(o) for o in reserved[1])
            sql = self.sql.copy_messages()[0]
            # Logged like any statement (DEBUG, CaptureQueriesContext), though it does not
            # go through Django's execute().
            logged = getattr(cursor, "debug_sql", None)
            try:
                with (logged(sql) if logged else nullcontext(),
                      self.connection.wrap_database_errors, cursor.cursor.copy(sql) as copy):
                    for offset, r in zip(offsets, rows, strict=True):
                        deliver_after = (r.deliver_at_ms if r.delay_ms is None
                                         else now_ms + r.delay_ms)
                        copy.write_row((offset, r.topic, r.partition_key, r.id, r.payload,
                                        r.metadata, now_ms, r.published_at, r.priority,
                                        deliver_after))
            except IntegrityError as error:
                if self.is_duplicate_message(error):
                    raise DuplicateMessage("a message id is stored already") from error
                raise
        return offsets

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        return None  # insert_messages returns them (RETURNING); never asked for here

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        if isinstance(error, DuplicateMessage):
            return True
        diag = getattr(error.__cause__, "diag", None)
        return (_sqlstate(error) == UNIQUE_VIOLATION
                and getattr(diag, "constraint_name", None) == "idx_topic_partition_id")

    def literal_bytes(self, payload: bytes | str, metadata: str | None) -> int:
        """psycopg binds parameters on the client: a bytea payload travels as hex (two
        characters a byte), a quote in the metadata doubled."""
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        text = (metadata or "").encode("utf-8")
        return 2 * len(data) + len(text) + text.count(b"'")

    # -- the rest of the vendor hooks --------------------------------------------------
    def is_lock_wait(self, error: BaseException) -> bool:
        return _sqlstate(error) in LOCK_WAIT_STATES

    # -- write_horizon -----------------------------------------------------------------
    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """Exact, no margin. A row's ``created_at`` is read from the clock after its
        transaction got its id (``message_clock_sql``), and the id stays in
        pg_stat_activity until the commit is visible. So when a transaction T that will
        commit a row with ``created_at`` c is still open at the moment this reads
        pg_stat_activity, and c < r (``r``: the clock, read just before), then T held its
        id before r and is listed, with ``xact_start`` <= c. The horizon, min(r, the
        oldest listed start), is therefore <= c for every such row: a row created before
        it belongs to a transaction that has ended. Transactions that will start later
        stamp their rows after r.

        Unknown (the caller falls back to MAX_TRANSACTION_AGE) while a session holding a
        transaction id is not readable by this role (grant it pg_read_all_stats; check
        sqlqueue.W105), and while a prepared transaction (two-phase commit, which
        Django never uses) is pending: it has no session, hence no start time."""
        cursor.execute(*self.sql.write_horizon())
        return self.sql.parse_write_horizon(cursor.fetchone())

    def max_statement_bytes(self) -> int:
        # Far below PostgreSQL's 1 GB limit on a statement's text: the size of one
        # round trip's worth of rows, as on the other vendors.
        return 8 << 20

