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

from collections.abc import Sequence
from contextlib import nullcontext

from django.db import IntegrityError, transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import MESSAGE_TABLE, Dialect, MessageRow
from sqlqueue.storage.statements import PostgreSQLStatements
from sqlqueue.storage.statements.vendors import PostgreSQLVendor

#: SQLSTATEs of a lock wait given up: lock_not_available (lock_timeout),
#: deadlock_detected, serialization_failure
LOCK_WAIT_STATES = frozenset({"55P03", "40P01", "40001"})
UNIQUE_VIOLATION = "23505"
#: The NOTIFY channel of wake-ups (sqlqueue.wakeups); its payload is the topic. NOTIFY
#: stays within one database, so the channel needs no database name.
WAKEUP_CHANNEL = "sqlqueue_wakeups"
#: rows from which ``insert_messages`` writes with COPY rather than a multi-row INSERT:
#: below it its three more round trips (a savepoint, the offsets) outweigh what COPY saves
#: (docs/benchmarks.md, "PostgreSQL")
COPY_MIN_ROWS = 50
def listen_wakeups_sql() -> str:
    """``listen_wakeups``: subscribe a session to the wake-up channel (the listener's own
    connection, in autocommit; a plain module function: it has no Django connection)."""
    return f'LISTEN "{WAKEUP_CHANNEL}"'


class DuplicateMessage(IntegrityError):
    """An ``insert_messages`` row whose (topic, partition_key, id) is stored already,
    inside a transaction.

    Raised by the dialect, not by the server: there the INSERT says ``ON CONFLICT DO
    NOTHING``, because on PostgreSQL a failed statement aborts the whole transaction,
    and publishing inside the caller's transaction must survive a duplicate."""


def _sqlstate(error: BaseException) -> str | None:
    """psycopg's SQLSTATE of ``error`` or of the driver error Django wrapped in it."""
    for candidate in (error, error.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    sql: PostgreSQLStatements
    now_ms_sql = PostgreSQLVendor.now_ms_sql
    locking_read_suffix = PostgreSQLVendor.locking_read_suffix
    # The address and port the server answered on, and when it started: a promoted
    # replica behind the same address (a moved virtual IP) started at another time.
    server_identity_sql = (
        "CONCAT(HOST(inet_server_addr()), ':', inet_server_port(), ' started ', "
        "EXTRACT(EPOCH FROM pg_postmaster_start_time()))"
    )
    # No index hints on PostgreSQL; the planner picks idx_topic_partition_offset for the
    # per-partition probes by itself (tests/integration/test_sql_statements.py, EXPLAIN).
    offset_index_hint = ""

    @property
    def message_clock_sql(self) -> str:
        return self.sql.message_clock_sql

    @property
    def returning_offset_sql(self) -> str:  # type: ignore[override]
        return f" RETURNING {self.quote('offset')}"

    def last_inserted_offset(self, cursor: CursorWrapper) -> int:
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    # -- insert_messages ---------------------------------------------------------------
    def insert_messages_sql(self, count: int, *, skip_stored: bool = False) -> str:
        """``insert_messages`` for PostgreSQL: a multi-row INSERT returning the offset
        and key of each row it stored. A row whose (topic, partition_key, id) is stored
        fails the statement, or with ``skip_stored`` (``insert_new_messages``) is skipped
        (``ON CONFLICT DO NOTHING`` on ``idx_topic_partition_id``). The clock is read
        once for the statement (``created_at``, and ``deliver_after`` of a delay, from
        the same reading) and after the transaction has its id (``write_horizon``)."""
        q = self.quote
        names = ("topic", "partition_key", "id", "payload", "metadata", "published_at",
                 "priority", "delay", "deliver_at")
        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * count)
        v = {name: f"v.{name}" for name in names}
        select = ", ".join([
            v["topic"], v["partition_key"], v["id"], f"{v['payload']}::bytea",
            f"{v['metadata']}::jsonb", "c.now_ms", f"{v['published_at']}::bigint",
            f"{v['priority']}::smallint",
            f"COALESCE(c.now_ms + {v['delay']}::bigint, {v['deliver_at']}::bigint)",
        ])
        columns = ", ".join(q(c) for c in self._INSERT_COLUMNS)
        skip = (f"ON CONFLICT ({q('topic')}, {q('partition_key')}, {q('id')}) DO NOTHING "
                if skip_stored else "")
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({columns}) SELECT {select} "
            f"FROM (VALUES {values}) v({', '.join(names)}) "
            f"CROSS JOIN (SELECT {self.message_clock_sql} AS now_ms) c "
            f"{skip}RETURNING {q('offset')}, {q('partition_key')}, {q('id')}"
        )

    # -- wake-ups -----------------------------------------------------------------------
    notifies_wakeups = True

    def notify_wakeup_sql(self) -> str:
        """``notify_wakeup``: queued by the server and delivered to the listeners only when
        the transaction commits (never if it rolls back); identical notifications of one
        transaction are delivered once."""
        return "SELECT pg_notify(%s, %s)"

    def notify_wakeup(self, cursor: CursorWrapper, topic: str) -> None:
        cursor.execute(self.notify_wakeup_sql(), [WAKEUP_CHANNEL, topic])

    def delete_inserted_messages_sql(self) -> str:
        """``delete_inserted_messages``: take back the rows an ``insert_new_messages`` of
        this transaction stored when another of its rows was a duplicate (primary key)."""
        q = self.quote
        return f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {q('offset')} = ANY(%s)"

    # COPY has no parameter limit: a chunk is bounded by max_statement_bytes, and the
    # rows of a chunk smaller than COPY_MIN_ROWS fit one INSERT's parameters.
    max_rows_per_insert = 5000

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow]
    ) -> list[int] | None:
        """Raises ``IntegrityError`` with nothing stored if any row is a duplicate, and
        the caller's transaction stays usable, as on the other vendors. From
        ``COPY_MIN_ROWS`` rows: ``copy_messages``.

        On PostgreSQL a failed statement aborts the transaction around it. So outside a
        transaction (autocommit: the statement is one) the plain INSERT fails on a
        duplicate as elsewhere; inside one, the INSERT skips stored rows, and if it
        skipped any, deletes the rows it stored beside them in the same transaction
        (no reader ever sees them) and raises ``DuplicateMessage``."""
        if len(rows) >= COPY_MIN_ROWS:
            return self.copy_messages(cursor, rows)
        params = self.insert_messages_params(rows)
        if self.connection.get_autocommit():
            cursor.execute(self.insert_messages_sql(len(rows)), params)
            stored = cursor.fetchall()
        else:
            cursor.execute(self.insert_messages_sql(len(rows), skip_stored=True), params)
            stored = cursor.fetchall()
            if len(stored) < len(rows):
                if stored:
                    cursor.execute(self.delete_inserted_messages_sql(),
                                   [[int(offset) for offset, _, _ in stored]])
                raise DuplicateMessage("a message id is stored already")
        # By key, not by position: RETURNING promises no order.
        offsets = {(str(pk), str(mid)): int(offset) for offset, pk, mid in stored}
        return [offsets[row.key] for row in rows]

    # -- copy_messages -----------------------------------------------------------------
    def reserve_offsets_sql(self) -> str:
        """``reserve_offsets``: the clock a ``copy_messages`` stamps ``created_at`` with,
        read after the transaction has its id (``message_clock_sql``, as the INSERT's
        clock is: the exact ``write_horizon`` rests on it), and the next offsets of
        queue_messages' identity sequence, as many as the rows to copy."""
        return (f"SELECT {self.message_clock_sql}, ARRAY(SELECT nextval("
                f"pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s))")

    def copy_messages_sql(self) -> str:
        """``copy_messages``: COPY FROM STDIN (text format) into queue_messages, offsets
        and clock included. A duplicate (topic, partition_key, id) fails it whole."""
        columns = ", ".join(self.quote(c) for c in ("offset", *self._INSERT_COLUMNS))
        return f"COPY {self.quote(MESSAGE_TABLE)} ({columns}) FROM STDIN"

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
            cursor.execute(self.reserve_offsets_sql(), [MESSAGE_TABLE, "offset", len(rows)])
            reserved = cursor.fetchone()
            assert reserved is not None
            now_ms, offsets = int(reserved[0]), sorted(int(o) for o in reserved[1])
            sql = self.copy_messages_sql()
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
    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def delete_messages_upto_sql(self) -> str:
        # No DELETE ... LIMIT: the oldest offsets of the partition are read first, in
        # idx_topic_partition_offset's order (so the planner takes that index and stops at
        # the limit), then deleted by primary key (= ANY of an array: index lookups, where
        # IN (subquery) may be planned as a join against the whole table).
        q = self.quote
        table, offset, topic, key = q(MESSAGE_TABLE), q("offset"), q("topic"), q("partition_key")
        return (
            f"DELETE FROM {table} WHERE {offset} = ANY(ARRAY(SELECT {offset} FROM {table} "
            f"WHERE {topic} = %s AND {key} = %s AND {offset} <= %s "
            f"ORDER BY {topic}, {key}, {offset} LIMIT %s))"
        )

    def delete_expired_idempotency_keys_sql(self) -> str:
        # No DELETE ... LIMIT: the rows are chosen by their physical address (a TID scan
        # of at most LIMIT rows). A key renewed meanwhile has a new address and stays.
        q = self.quote
        table, expires = q("queue_idempotency_keys"), q("expires_at")
        return (f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} "
                f"WHERE {expires} <= {self.now_ms_sql} ORDER BY {expires} LIMIT %s))")

    def bound_lock_waits(self, cursor: CursorWrapper, seconds: int) -> None:
        # set_config, not SET: SET takes no parameters. Session-wide (is_local false);
        # called outside a transaction, so no rollback undoes it.
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{seconds}s"])

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

    def horizon_privileges_sql(self) -> str:
        """``horizon_privileges``: may this role see every session's transaction start
        (superuser, or member of pg_read_all_stats)?"""
        return "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')"

    def max_statement_bytes(self) -> int:
        # Far below PostgreSQL's 1 GB limit on a statement's text: the size of one
        # round trip's worth of rows, as on the other vendors.
        return 8 << 20

    def offset_counter_sql(self) -> str:
        """``offset_counter``: the last offset the identity's sequence handed out (NULL
        before the first)."""
        return ("SELECT pg_sequence_last_value(pg_get_serial_sequence("
                f"'{MESSAGE_TABLE}', 'offset')::regclass)")
