"""PostgreSQL's vendor hooks of the statement layer (``sqlqueue.storage.statements``):
its clocks, locking reads, server identity, seeks and write horizon."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlqueue.horizon import UNKNOWN, WriteHorizon
from sqlqueue.storage.statements.tables import MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import OnConflictVendor, Statement

#: a double-quoted identifier not qualified by a table name (nor part of a longer one)
_BARE_COLUMN = re.compile(r'(?<![.\w"])("[^"]+")')


def epoch_ms_sql(clock: str) -> str:
    """A PostgreSQL timestamp expression in epoch milliseconds."""
    # EXTRACT(EPOCH ...) is numeric (PostgreSQL 14+): FLOOR truncates to the millisecond
    # like the other vendors' clocks, where a cast alone would round up.
    return f"FLOOR(EXTRACT(EPOCH FROM {clock}) * 1000)::bigint"


class PostgreSQLVendor(OnConflictVendor):
    """PostgreSQL 14+. ``now_ms_sql`` is ``statement_timestamp()``: one value for the
    whole statement, as the other vendors' clocks are."""

    vendor = "postgresql"
    now_ms_sql = f"({epoch_ms_sql('statement_timestamp()')})"
    # Waits for a concurrent writer of the row, then reads its newest committed version.
    locking_read_suffix = " FOR SHARE"
    integer_mark = "%s::bigint"
    # = ANY of an array: index lookups, where IN (subquery) may be planned as a join
    # against the whole table. The oldest offsets of a partition are chosen in
    # idx_topic_partition_offset's order, so that the planner takes that index and stops
    # at the limit; expired keys by their physical address (a TID scan of at most LIMIT
    # rows; a key renewed meanwhile has a new address and stays).
    chosen_rows_sql = "{column} = ANY(ARRAY({select}))"
    row_address = "ctid"
    gc_order = ("topic", "partition_key", "offset")
    # The address and port the server answered on, and when it started: a promoted
    # replica behind the same address (a moved virtual IP) started at another time.
    server_identity_sql = (
        "CONCAT(HOST(inet_server_addr()), ':', inet_server_port(), ' started ', "
        "EXTRACT(EPOCH FROM pg_postmaster_start_time()))"
    )
    # No index hints on PostgreSQL; the planner picks idx_topic_partition_offset for the
    # per-partition probes by itself (tests/integration/test_sql_statements.py, EXPLAIN).
    returning_offset_sql = ' RETURNING "offset"'

    def seek_sql(self, column: str, where: str, *, last: bool = False) -> str:
        """ORDER BY ... LIMIT 1 rather than MIN or MAX: PostgreSQL's planner seeks a MIN
        only when it expects the range to hold more than about a row. With statistics
        older than the rows (a topic written since the table was last analyzed, as a new
        topic's first backlog is until autovacuum looks again) it read every row of the
        range instead: 200 per partition in the test, a million in a big backlog. This
        form has the one plan whatever the statistics say."""
        return (f"(SELECT {column} FROM {self.quote(MESSAGE_TABLE)} WHERE {where} "
                f"ORDER BY {column}{' DESC' if last else ''} LIMIT 1)")

    def offset_counter(self) -> Statement:
        # The last offset the identity's sequence handed out (NULL before the first).
        return ("SELECT pg_sequence_last_value(pg_get_serial_sequence(%s, 'offset')"
                "::regclass)", [MESSAGE_TABLE])

    @property
    def message_clock_sql(self) -> str:
        # CASE evaluates its condition first: pg_current_xact_id() gives the transaction
        # its id (if it has none yet) before the clock is read, the order the exact
        # write horizon rests on (sqlqueue.storage.sql.postgresql).
        return (f"(CASE WHEN pg_current_xact_id() IS NOT NULL THEN "
                f"{epoch_ms_sql('clock_timestamp()')} END)")

    def stored_columns(self, expression: str, table: str) -> str:
        # In ON CONFLICT DO UPDATE a bare column is ambiguous (the stored row's, or
        # EXCLUDED's): qualify it with the table.
        if not table:
            raise ValueError("upsert_clause() needs table= on PostgreSQL")
        target = self.quote(table)
        return _BARE_COLUMN.sub(lambda m: f"{target}.{m.group(1)}", expression)

    def write_horizon(self) -> Statement:
        # The clock created_at is stamped from, read first; then, from a fresh copy of
        # pg_stat_activity, the start of the oldest transaction of this database that
        # holds a transaction id, and how many such sessions this role may not see (other
        # roles' sessions, without pg_read_all_stats); and how many prepared transactions
        # this database has. The LATERAL subquery depends on the clock's row, so it runs
        # after it (and after pg_stat_clear_snapshot() dropped the copy this transaction
        # may have cached). Why this is exact: sqlqueue.storage.sql.postgresql.
        this_database = "(SELECT oid FROM pg_database WHERE datname = current_database())"
        return (
            f"WITH c AS MATERIALIZED (SELECT pg_stat_clear_snapshot() AS cleared, "
            f"{epoch_ms_sql('clock_timestamp()')} AS now_ms) "
            f"SELECT c.now_ms, a.oldest, a.hidden, (SELECT COUNT(*) FROM pg_prepared_xacts "
            f"WHERE database = current_database()) FROM c CROSS JOIN LATERAL ("
            f"SELECT {epoch_ms_sql('MIN(xact_start)')} AS oldest, "
            f"COUNT(*) FILTER (WHERE xact_start IS NULL) AS hidden FROM pg_stat_activity "
            f"WHERE backend_xid IS NOT NULL AND datid = {this_database} "
            f"AND c.now_ms IS NOT NULL) a",
            [],
        )

    def parse_write_horizon(self, row: Sequence[Any] | None) -> WriteHorizon:
        # Unknown while a session holding a transaction id is not readable by this role,
        # or a prepared transaction (no session, hence no start time) is pending.
        assert row is not None
        now_ms, oldest, hidden, prepared = row
        if hidden or prepared:
            return UNKNOWN
        return WriteHorizon(None if oldest is None else int(oldest), int(now_ms), 0)
