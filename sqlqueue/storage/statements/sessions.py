"""Named statements about a database session rather than the queue's rows: what a
connection is (its character set, a Galera node?), how it waits for locks, and how an
executor outside Django begins a transaction. Each returns a ``Statement``,
or None where the vendor needs none; the Django stores and the Spark executors run
them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlqueue.storage.statements.postgresql import epoch_ms_sql
from sqlqueue.storage.statements.vendors import Statement, Vendor


class SessionStatements(Vendor):
    """What every vendor answers (a mixin of ``Statements``)."""

    #: begins a transaction (an executor outside Django: the Spark data source's)
    begin_sql = "BEGIN"
    #: begins a transaction that the database lists among the open ones at once (where
    #: ``write_horizon`` is not None)
    begin_snapshot_sql = ""

    def bound_lock_waits(self, seconds: int) -> Statement | None:
        """``bound_lock_waits``: give up a row-lock wait of this session after
        ``seconds`` (None: the connection's own busy timeout applies)."""
        return None

    def bound_transaction_lock_waits(self, seconds: int) -> Statement | None:
        """``bound_transaction_lock_waits``: ``bound_lock_waits`` for the current
        transaction only (None: the vendor has no such setting; its session one is used)."""
        return None

    def bound_idle_transactions(self, milliseconds: int) -> Statement | None:
        """``bound_idle_transactions``: the server ends this session (rolling back its
        transaction, releasing its row locks) once a transaction stays idle, no statement
        running, for ``milliseconds`` (None: the vendor has no such setting). A runner
        frozen inside its cycle transaction (SIGSTOP, a VM pause, a log write to a full
        pipe) then holds its lease rows for about a lease, not for as long as it is
        frozen. For the session of a connection the runner owns only."""
        return None

    def galera(self) -> Statement | None:
        """``galera``: 1 on a node of a Galera cluster (MariaDB's ``wsrep_on``), whose
        open transactions one node cannot see; an error where the variable does not
        exist (MySQL), which means no. None: no such cluster for this vendor."""
        return None

    def oldest_writer(self) -> Statement | None:
        """``oldest_writer``: the open transaction of another session that has written
        and began first, the one the write horizon waits for (a graceful exit that left
        a watermark behind names it): one row (session id, database, its start and its
        current statement's start in epoch ms, state, current or last statement, how
        long it has been open in ms), or none. None: the vendor has one writer at a time
        (SQLite), nothing holds a horizon back."""
        return None


class MySQLSessions(SessionStatements):
    """MySQL's and MariaDB's (a mixin of ``MySQLStatements``)."""

    begin_sql = "START TRANSACTION"
    # A plain START TRANSACTION starts InnoDB's transaction only at the first table read.
    begin_snapshot_sql = "START TRANSACTION WITH CONSISTENT SNAPSHOT"

    def bound_lock_waits(self, seconds: int) -> Statement:
        return "SET SESSION innodb_lock_wait_timeout = %s", [seconds]

    def bound_idle_transactions(self, milliseconds: int) -> Statement:
        # MariaDB's (10.3+), in whole seconds, rounded up; MySQL has no such variable
        # (its executor does not run this there). The server kills the connection.
        return "SET SESSION idle_transaction_timeout = %s", [max(1, -(-milliseconds // 1000))]

    def galera(self) -> Statement:
        return "SELECT @@wsrep_on", []

    def oldest_writer(self) -> Statement:
        # INNODB_TRX lists the server's transactions (every database's: the horizon reads
        # it so); its statement's start is not kept, nor its last statement once idle.
        return ("SELECT t.trx_mysql_thread_id, p.DB, UNIX_TIMESTAMP(t.trx_started) * 1000, "
                "NULL, t.trx_state, t.trx_query, "
                "(UNIX_TIMESTAMP(NOW(3)) - UNIX_TIMESTAMP(t.trx_started)) * 1000 "
                "FROM information_schema.INNODB_TRX t LEFT JOIN information_schema.PROCESSLIST p "
                "ON p.ID = t.trx_mysql_thread_id WHERE t.trx_rows_modified > 0 "
                "AND t.trx_mysql_thread_id <> CONNECTION_ID() ORDER BY t.trx_started LIMIT 1",
                [])

    def connection_charset(self) -> Statement:
        """``connection_charset``: the character set of this connection (sqlqueue needs
        utf8mb4), and the largest packet the server takes (no statement may exceed it)."""
        return "SELECT @@character_set_connection, @@max_allowed_packet", []

    def server_settings(self) -> Statement:
        """``server_settings`` (system checks): the connection's character set and the
        largest packet the server takes."""
        return "SELECT @@character_set_connection, @@max_allowed_packet", []

    def isolation_level(self, variable: str) -> Statement:
        """``isolation_level`` (system checks): this session's, by the name of its
        variable (``transaction_isolation``; older MariaDB ``tx_isolation``)."""
        if not variable.isidentifier():
            raise ValueError(f"not a variable name: {variable!r}")
        return f"SELECT @@SESSION.{variable}", []

    def table_collations(self, tables: Sequence[str]) -> Statement:
        """``table_collations`` (system checks): (table, collation) of ``tables`` (at
        least one) in the connection's database."""
        return ("SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({self.marks(len(tables))})",
                list(tables))

    def autoinc_lock_mode(self) -> Statement:
        """``autoinc_lock_mode``: 0 or 1: a multi-row INSERT gets consecutive offsets."""
        return "SELECT @@innodb_autoinc_lock_mode", []


class PostgreSQLSessions(SessionStatements):
    """PostgreSQL's (a mixin of ``PostgreSQLStatements``)."""

    def bound_lock_waits(self, seconds: int) -> Statement:
        # set_config, not SET: SET takes no parameters. Session-wide (is_local false).
        return "SELECT set_config('lock_timeout', %s, false)", [f"{seconds}s"]

    def bound_idle_transactions(self, milliseconds: int) -> Statement:
        # Session-wide (is_local false); the server terminates the session (SQLSTATE
        # 25P03, idle_in_transaction_session_timeout).
        return ("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                [f"{milliseconds}ms"])

    def bound_transaction_lock_waits(self, seconds: int) -> Statement:
        # is_local true: SET LOCAL, gone at the transaction's end. Behind a transaction
        # pooler the session is the pool's: nothing may stay on it.
        return "SELECT set_config('lock_timeout', %s, true)", [f"{seconds}s"]

    def oldest_writer(self) -> Statement:
        # Sessions of this database holding a transaction id (they wrote), as the
        # horizon reads them (write_horizon); the query is the running or the last one.
        ms = epoch_ms_sql
        return (f"SELECT pid, datname, {ms('xact_start')}, {ms('query_start')}, state, query, "
                f"{ms('clock_timestamp()')} - {ms('xact_start')} FROM pg_stat_activity "
                "WHERE backend_xid IS NOT NULL AND datname = current_database() "
                "AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1", [])

    def name_session(self, name: str) -> Statement:
        """``name_session``: the ``application_name`` of this session, for a connection
        sqlqueue owns (never one it shares through a pool: the name would stick to the
        server session for the pool's next clients)."""
        return "SELECT set_config('application_name', %s, false)", [name]

    def server_settings(self) -> Statement:
        """``server_settings`` (system checks): the database's encoding and the server's
        default transaction isolation."""
        return ("SELECT current_setting('server_encoding'), "
                "current_setting('default_transaction_isolation')", [])

    def horizon_privileges(self) -> Statement:
        """``horizon_privileges``: may this role see every session's transaction start
        (superuser, or member of pg_read_all_stats)?"""
        return "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')", []
