"""Statements for MySQL 8.0+ and MariaDB 10.11+.

``offset`` is a reserved word in MariaDB >= 10.6, so every identifier goes through
``quote_name``. Time comes from the server (``UTC_TIMESTAMP``), never from the session
time zone nor from the worker's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import MySQLdb
from django.db import DatabaseError, IntegrityError
from django.db.backends.mysql.base import CursorWrapper as MySQLCursorWrapper
from django.db.backends.utils import CursorWrapper

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.horizon import WriteHorizon
from sqlqueue.literals import escaped_length
from sqlqueue.storage.sql.base import MessageRow, Store
from sqlqueue.storage.statements import MySQLStatements
from sqlqueue.storage.statements.vendors import MySQLVendor

ER_DUP_ENTRY = 1062
#: the connection is gone: CR_SERVER_GONE_ERROR, CR_SERVER_LOST, and MySQL 8's
#: ER_CLIENT_INTERACTION_TIMEOUT (the server ended an idle session)
CONNECTION_LOST = (2006, 2013, 4031)

#: What a one-row INSERT adds to its row's payload and metadata literals: the statement's
#: text, and the topic, key and id (at most 255 bytes each, escaped twice as long).
STATEMENT_AROUND_A_ROW = 8 * 1024


class MySQLStore(Store):
    probes_per_statement = 2_000  # the lag's probes (OperatingAccess)
    _autoinc_lock_mode: int | None = None  # read once per connection, when first needed
    _checked_connection: object | None = None  # the DB-API connection found to be utf8mb4
    _max_packet: int | None = None  # its server's max_allowed_packet, read with the charset

    vendor = "mysql"
    sql: MySQLStatements
    now_ms_sql = MySQLVendor.now_ms_sql
    locking_read_suffix = MySQLVendor.locking_read_suffix
    server_identity_sql = MySQLVendor.server_identity_sql
    #: a UNION ALL of 16 partitions' fetches took 2.3-2.6 ms a poll (``Store``'s note)
    narrows_fetches = True

    # -- connection_charset --------------------------------------------------------------
    def check_connection(self) -> None:
        """A connection whose character set is not utf8mb4 would store the UTF-8 bytes of
        topics, keys and ids as latin1 (or utf8mb3) characters: ``kéy🦆`` comes back as
        mojibake, and two spellings of a key no longer compare equal. Read once per
        DB-API connection (a reconnect is checked again), with ``max_allowed_packet``
        (``max_row_bytes``); cheap afterwards."""
        raw = self.connection.connection
        if raw is not None and raw is self._checked_connection:
            return
        self.connection.ensure_connection()
        raw = self.connection.connection
        with self.connection.cursor() as cursor:
            cursor.execute(*self.sql.connection_charset())
            row = cursor.fetchone()
        charset = str(row[0]) if row else "?"
        self._max_packet = int(row[1]) if row and row[1] else None
        if charset != "utf8mb4":
            alias = self.connection.alias
            raise ConfigurationError(
                f"The connection to database {alias!r} uses the character set {charset!r}; "
                "sqlqueue needs utf8mb4 and refuses to write through it (topics, keys and "
                f"ids would be stored garbled). Set DATABASES[{alias!r}]['OPTIONS']"
                "['charset'] = 'utf8mb4' (check sqlqueue.E103)."
            )
        self._checked_connection = raw

    def _new_publishing_cursor(self) -> CursorWrapper:
        """Django's cursor wrappers (``execute_wrapper``s, the error translation, the
        broken-transaction check) around an ``InsertCursor`` instead of mysqlclient's
        cursor. Not on a DB-API connection of another class than mysqlclient's own (a
        tracing library's proxy, whose cursors record the statements)."""
        connection = self.connection
        connection.ensure_connection()
        raw = connection.connection
        if type(raw) is not MySQLdb.connections.Connection:
            return connection.cursor()
        connection.validate_thread_sharing()
        # make_cursor takes any DB-API cursor (django-stubs says Django's own wrapper)
        return connection.make_cursor(MySQLCursorWrapper(InsertCursor(raw)))  # type: ignore[arg-type]

    # -- insert_messages ---------------------------------------------------------------
    # The hot path of publishing: ``store_messages`` of MySQLStatements leaves created_at
    # to the column's DEFAULT, and ``_message_literals`` writes the values as literals.
    max_rows_per_insert = 1000  # no parameters to bound it; max_statement_bytes does

    def execute_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
        """With the values inlined: mysqlclient escapes parameter by parameter in Python,
        which took an eighth of a draining runconsumer's main thread (and of publishing,
        and of a lag scrape's thousands of probes). Numbers are formatted, and each
        distinct string (the group, the topic, a partition key: they repeat on every
        row) is escaped once, by the live connection (mysql_real_escape_string for the
        connection's character set, the same escaping mysqlclient applies)."""
        self.connection.ensure_connection()  # the escaping is the live connection's
        raw = self.connection.connection
        escaped: dict[str, bytes] = {}
        values: list[bytes] = []
        # Bound once: a 1,000-row publish passes 8,000 values through this loop.
        append, cached, string_literal = values.append, escaped.get, raw.string_literal
        for value in params:  # one loop, no call per value: this runs for every message
            kind = type(value)
            if kind is int:
                append(b"%d" % value)
            elif kind is str:
                found = cached(value)
                if found is None:
                    found = escaped[value] = string_literal(value.encode("utf-8"))
                append(found)
            elif kind is bytes:  # a payload
                append(string_literal(value))
            elif value is None:
                append(b"NULL")
            elif kind is bool:
                append(b"1" if value else b"0")
            else:
                append(bytes(raw.literal(value)))
        cursor.execute(sql.encode("utf-8") % tuple(values))  # type: ignore[arg-type]

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow], *, wake: str | None = None,
        prepared: bool = False,
    ) -> list[int] | None:
        text, _ = self.sql.store_messages(rows)
        cursor.execute(text.encode("utf-8") % tuple(self._message_literals(rows)))  # type: ignore[arg-type]
        return self.inserted_offsets(cursor, len(rows))

    def _message_literals(self, rows: Sequence[MessageRow]) -> list[bytes]:
        """``store_messages``' parameters as escaped literals, in its order (topic, key,
        id, payload, metadata, published_at, priority, deliver_after or delay): what
        ``execute_rows`` does, row-aware, for the hot path of publishing. Topics and keys
        repeat (escaped once); an id sqlqueue made is hex and dashes (nothing to escape)."""
        # The escaping is the live connection's: the cursor's, connected already.
        escape = self.connection.connection.string_literal
        names: dict[str, bytes] = {}
        values: list[bytes] = []
        extend = values.extend
        for r in rows:
            topic = names.get(r.topic)
            if topic is None:
                topic = names[r.topic] = escape(r.topic.encode("utf-8"))
            key = names.get(r.partition_key)
            if key is None:
                key = names[r.partition_key] = escape(r.partition_key.encode("utf-8"))
            extend((
                topic, key,
                b"'%s'" % r.id.encode("ascii") if r.fresh_id else escape(r.id.encode("utf-8")),
                escape(r.payload),
                b"NULL" if r.metadata is None else escape(r.metadata.encode("utf-8")),
                b"%d" % r.published_at, b"%d" % r.priority,
                b"%d" % (r.deliver_at_ms if r.delay_ms is None else r.delay_ms),
            ))
        return values

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        # LAST_INSERT_ID() is the first row's offset. A multi-row INSERT ... VALUES is a
        # "simple insert": with innodb_autoinc_lock_mode 0 or 1 InnoDB allocates its
        # offsets as one consecutive run, in row order. Mode 2 (MySQL 8's default) does
        # not promise that in writing, so there the rows are read back instead.
        first = int(cursor.lastrowid)
        if count == 1 or self._consecutive_autoinc(cursor):
            return list(range(first, first + count))
        return None

    def _consecutive_autoinc(self, cursor: CursorWrapper) -> bool:
        if self._autoinc_lock_mode is None:
            cursor.execute(*self.sql.autoinc_lock_mode())
            row = cursor.fetchone()
            self._autoinc_lock_mode = int(row[0]) if row else 2
        return self._autoinc_lock_mode <= 1

    _horizon_unavailable = False
    _galera: bool | None = None

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """``write_horizon`` (sqlqueue.storage.statements.vendors). Needs the PROCESS
        privilege; without it this raises DatabaseError (once; then without asking again)
        and the caller assumes MAX_TRANSACTION_AGE. Inside a started transaction (a
        locking read has started it), a fresh snapshot lists the reader's own
        transaction: reading INNODB_TRX alone starts none."""
        if self._horizon_unavailable:
            raise DatabaseError("information_schema.INNODB_TRX is not readable")
        if self.is_galera(cursor):
            self._horizon_unavailable = True
            raise DatabaseError("a Galera node's INNODB_TRX shows its own transactions only")
        try:
            cursor.execute(*self.sql.write_horizon())
        except DatabaseError as error:
            # Not for good when the connection was lost (the server ended the session):
            # the next connection reads it again.
            if not (error.args and error.args[0] in CONNECTION_LOST):
                self._horizon_unavailable = True
            raise
        return self.sql.parse_write_horizon(cursor.fetchone())

    def bound_idle_transactions(self, cursor: CursorWrapper, milliseconds: int) -> bool:
        """MariaDB only: MySQL has no ``idle_transaction_timeout``."""
        if not getattr(self.connection, "mysql_is_mariadb", False):
            return False
        return super().bound_idle_transactions(cursor, milliseconds)

    def is_lock_wait(self, error: BaseException) -> bool:
        # 1205 ER_LOCK_WAIT_TIMEOUT, 1213 ER_LOCK_DEADLOCK
        return bool(error.args) and error.args[0] in (1205, 1213)

    def is_galera(self, cursor: CursorWrapper) -> bool:
        """``galera``: is this server a node of a Galera cluster (wsrep on)? Asked once
        per connection."""
        if self._galera is None:
            try:
                cursor.execute(*self.sql.galera())
                row = cursor.fetchone()
                self._galera = bool(row and row[0] and int(row[0]))
            except DatabaseError:
                self._galera = False  # MySQL: no such variable
        return self._galera

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        code = error.args[0] if error.args else None
        return code == ER_DUP_ENTRY and "idx_topic_partition_id" in str(error)

    def max_statement_bytes(self) -> int:
        # Stay well under max_allowed_packet (16 MiB by default on MariaDB, 64 on MySQL),
        # and under a server's smaller one.
        row_limit = self.max_row_bytes()
        return 4 << 20 if row_limit is None else max(1, min(4 << 20, row_limit))

    def max_row_bytes(self) -> int | None:
        """A statement travels in one packet, rows inlined as escaped literals: a row
        whose ``literal_bytes`` exceed the server's ``max_allowed_packet`` (less the
        statement around them) would be refused mid-send, the connection dropped ("server
        has gone away")."""
        if self._max_packet is None:
            return None
        return self._max_packet - STATEMENT_AROUND_A_ROW

    def literal_bytes(self, payload: bytes | str, metadata: str | None) -> int:
        """Rows are inlined as escaped literals: every byte mysql_real_escape_string
        escapes (NUL, newline, return, backslash, quotes, Ctrl-Z) counts twice, so that
        a payload of quotes cannot make a statement twice the size it was cut for."""
        size = escaped_length(payload.encode("utf-8") if isinstance(payload, str) else payload)
        return size + escaped_length(metadata.encode("utf-8")) if metadata else size


class InsertCursor:
    """The part of a DB-API cursor a publish's INSERT uses, on mysqlclient's connection
    itself: ``query``, then the affected rows and the first AUTO_INCREMENT value.
    mysqlclient's ``Cursor.execute`` also drains earlier result sets, asks for one of
    its own and describes it on every call: for an INSERT with its values inline, which
    answers no rows, that was 10 of a one-message publish's 163 µs of client CPU (the
    two cursors in turns, docs/benchmarks-history.md, 2026-11-28 morning). Only for such
    statements: one that answers rows is refused (``ProgrammingError``), its rows
    discarded, the connection left usable."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.rowcount = -1
        self.lastrowid: int | None = None

    def execute(self, query: bytes | str, args: Any = None) -> int:
        if args is not None:
            raise MySQLdb.ProgrammingError("InsertCursor runs statements with their values "
                                           "inline; it takes no parameters.")
        raw = self._raw
        raw.query(query)
        if raw.field_count():
            raw.discard_result()
            raise MySQLdb.ProgrammingError("InsertCursor runs statements that answer no "
                                           "rows; this one answered some.")
        self.rowcount = raw.affected_rows()
        self.lastrowid = raw.insert_id()
        return self.rowcount

    def close(self) -> None:
        """Nothing to free: no result set is ever kept."""
