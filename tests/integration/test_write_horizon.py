"""The write horizon against a real server, with real second connections (guarantee I4).

PostgreSQL lists every open transaction exactly (pg_stat_activity): its tests check that
the reader's own and another connection's open writers bound the horizon with no margin,
and that a long read-only query does not.

On MySQL and MariaDB, INNODB_TRX is a server-wide snapshot that InnoDB refreshes only
when nobody has read it for 0.1 s. These tests read it as the consumer engine does, from
inside a transaction a locking read has started, and check that a fresh snapshot lists
that transaction, that an open writer holds the horizon back, and that a snapshot kept
stale by another reader never lets the horizon pass a writer that began after it was
taken.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.backends.utils import CursorWrapper

from sqlqueue import horizon as horizon_module
from sqlqueue import send_message
from sqlqueue.horizon import MARGIN_MS, WriteHorizon, settled_before
from sqlqueue.models import QueueMessage
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # the fixture

AGE_MS = 300_000  # MAX_TRANSACTION_AGE
TIMEOUT = 20.0
POLL = 0.15  # INNODB_TRX is refreshed once nobody read it for 0.1 s
# Test-only: whether this connection's transaction is in INNODB_TRX's snapshot. Read at
# once after the horizon, so from the same snapshot.
OWN_TRANSACTION = ("SELECT MIN(UNIX_TIMESTAMP(trx_started)) * 1000 FROM "
                   "information_schema.INNODB_TRX WHERE trx_mysql_thread_id = CONNECTION_ID()")
# PostgreSQL: the start of this session's transaction. Its view is never stale: whether
# the transaction holds an id (is a writer the horizon must wait for) is checked below.
OWN_TRANSACTION_PG = ("SELECT FLOOR(EXTRACT(EPOCH FROM xact_start) * 1000)::bigint FROM "
                      "pg_stat_activity WHERE pid = pg_backend_pid()")


class Read:
    """One read of the horizon, as the consumer engine makes it."""

    def __init__(self, seen: WriteHorizon, own_start_ms: int | None, now_ms: int) -> None:
        self.seen = seen
        self.own_start_ms = own_start_ms  # None: the snapshot predates our transaction
        self.now_ms = now_ms

    def horizon(self, previous_ms: int | None = None) -> int:
        return settled_before(self.seen, self.now_ms, AGE_MS, previous_ms)


def read_horizon() -> Read:
    store = store_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        now_ms = store.database_now_ms(cursor)
        store.list_leases(cursor, "g", "t", lock=True)  # the fence starts the transaction
        seen = store.write_horizon(cursor)
        assert seen is not None
        cursor.execute(OWN_TRANSACTION_PG if connection.vendor == "postgresql"
                       else OWN_TRANSACTION)
        found = cursor.fetchone()
        own = found[0] if found else None
    return Read(seen, None if own is None else int(own), now_ms)


def wait_for(condition: Callable[[Read], bool], what: str) -> Read:
    """Polls (a condition, not a fixed sleep): the snapshot refreshes between polls."""
    deadline = time.monotonic() + TIMEOUT
    while not condition(read := read_horizon()):
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(POLL)
    return read


def database_now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


@contextmanager
def open_writer(commit: bool = True) -> Iterator[int]:
    """A publishing transaction held open on a second connection; yields its message's
    created_at (database ms). Commits (or rolls back) when the block ends."""
    held, release = threading.Event(), threading.Event()
    created: list[int] = []
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            with transaction.atomic():
                sent = send_message("t", {"late": True}, partition_key="k")
                created.append(QueueMessage.objects.get(offset=sent.offset).created_at)
                held.set()
                release.wait(TIMEOUT)
                transaction.set_rollback(not commit)
        except BaseException as exc:
            errors.append(exc)
            held.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    assert held.wait(TIMEOUT)
    try:
        assert not errors, errors
        yield created[0]
    finally:
        release.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive()


@contextmanager
def hammering_reader() -> Iterator[list[int]]:
    """A second connection reading INNODB_TRX without pause, which keeps InnoDB from
    refreshing the snapshot for every reader; yields its read count so far."""
    stop = threading.Event()
    reads = [0]

    def hammer() -> None:
        try:
            with connections["default"].cursor() as cursor:
                while not stop.is_set():
                    cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX")
                    cursor.fetchall()
                    reads[0] += 1
        finally:
            connections.close_all()

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while reads[0] < 100:  # reading: the snapshot it froze predates what follows
            assert time.monotonic() < deadline and thread.is_alive(), "the reader never read"
            time.sleep(0.01)
        yield reads
    finally:
        stop.set()
        thread.join(TIMEOUT)


def test_write_horizon_is_none_on_sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's variant; MySQL/MariaDB's are below")
    with connection.cursor() as cursor:
        assert store_for(connection).write_horizon(cursor) is None


def test_a_fresh_snapshot_lists_our_own_transaction(server_database: None) -> None:
    before = database_now_ms()
    read = wait_for(lambda r: r.own_start_ms is not None, "our own transaction listed")
    assert read.own_start_ms is not None and read.seen.newest_start_ms is not None
    assert read.own_start_ms >= before - 1000  # ours (whole seconds), begun after `before`
    assert read.seen.newest_start_ms >= read.own_start_ms
    # No other transaction open, only ours: settled up to a second before it began (on
    # PostgreSQL, whose view is exact, up to then).
    if read.seen.oldest_writer_ms is None:
        assert read.horizon() == (min(read.seen.newest_start_ms, read.now_ms)
                                  - read.seen.margin_ms)
        assert read.seen.margin_ms == (0 if connection.vendor == "postgresql" else MARGIN_MS)


def test_postgresql_reads_a_writing_transaction_exactly(server_database: None) -> None:
    """A transaction that holds an id (it wrote, or locked a row) is listed to the
    millisecond, and the horizon is its start, with no margin."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's exact horizon; MySQL/MariaDB's snapshot is tested above")
    store = store_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id(), "
                       "FLOOR(EXTRACT(EPOCH FROM transaction_timestamp()) * 1000)::bigint")
        own_start = int(cursor.fetchone()[1])
        now_ms = store.database_now_ms(cursor)
        seen = store.write_horizon(cursor)
    assert seen is not None and seen.margin_ms == 0
    assert seen.oldest_writer_ms is not None and seen.newest_start_ms is not None
    assert seen.oldest_writer_ms <= own_start  # ours, or an older writer's
    assert seen.newest_start_ms >= now_ms  # the clock is read at the horizon's statement
    if seen.oldest_writer_ms == own_start:  # no other writer open
        assert settled_before(seen, seen.newest_start_ms, AGE_MS) == own_start


def test_postgresql_lists_no_reader_without_an_id(server_database: None) -> None:
    """A transaction that has written nothing (its fence locked no row) holds no id: it
    is not a writer, and the horizon is the moment of reading."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's exact horizon")
    read = read_horizon()  # no lease row: the fence locks nothing
    assert read.own_start_ms is not None
    if read.seen.oldest_writer_ms is None:  # no other writer open on the server
        assert read.horizon() == min(read.seen.newest_start_ms or 0, read.now_ms)
        assert read.seen.newest_start_ms is not None
        assert read.seen.newest_start_ms >= read.own_start_ms


def test_postgresql_is_not_held_back_by_a_long_read(server_database: None) -> None:
    """Only transactions holding an id bound the horizon: one that only reads, however
    long, gets none and cannot commit a row."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's exact horizon")
    started, done = threading.Event(), threading.Event()

    def long_read() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT COUNT(*) FROM queue_messages")
                started.set()
                # Reads on, in its one transaction, until the test has seen the horizon.
                deadline = time.monotonic() + TIMEOUT  # bounds a hang only
                while not done.is_set() and time.monotonic() < deadline:
                    cursor.execute("SELECT pg_sleep(0.05)")
        finally:
            connections.close_all()

    reader = threading.Thread(target=long_read, daemon=True)
    reader.start()
    try:
        assert started.wait(TIMEOUT), "the long read never began"
        began = database_now_ms()
        wait_for(lambda read: read.horizon() > began and not done.is_set(),
                 "the horizon pass the start of a read still open")
        assert reader.is_alive(), "the read ended before the horizon passed its start"
    finally:
        done.set()
        reader.join(TIMEOUT)


def test_an_open_writer_on_another_connection_holds_the_horizon_back(
    server_database: None,
) -> None:
    with open_writer() as created_at:
        read = wait_for(lambda r: r.own_start_ms is not None, "a fresh snapshot")
        assert read.seen.oldest_writer_ms is not None
        # Whole seconds on MySQL/MariaDB; exact on PostgreSQL.
        slack = 0 if connection.vendor == "postgresql" else 1000
        assert read.seen.oldest_writer_ms <= created_at + slack
        # Its row is not settled (rows created *before* the horizon are): it may commit
        # late. Equal on PostgreSQL when the transaction began in the INSERT's
        # millisecond.
        assert read.horizon() <= created_at
    # Committed: the horizon moves past it.
    wait_for(lambda r: r.own_start_ms is not None and r.horizon() > created_at,
             "the horizon pass the committed row")


def test_a_stale_snapshot_never_passes_a_writer_that_began_after_it(mysql_only: None) -> None:
    fresh = wait_for(lambda r: r.own_start_ms is not None, "a fresh snapshot")
    previous = fresh.horizon()
    # The snapshot the reader freezes may be that fresh one, which lists this connection's
    # last transaction (CONNECTION_ID() names the connection, not the transaction). The
    # reads below are made on a new connection, which no earlier snapshot can list.
    connection.close()
    with hammering_reader() as reads:
        before = database_now_ms()
        with open_writer(commit=False) as created_at:
            assert created_at >= before
            deadline = time.monotonic() + TIMEOUT
            stale: list[Read] = []
            # Stale for longer than the margin: trusting the snapshot (no writer listed,
            # so settled up to now - margin) would pass the writer's row by then.
            while not stale or stale[-1].now_ms <= created_at + 2 * MARGIN_MS:
                assert time.monotonic() < deadline, "the snapshot did not stay stale"
                read = read_horizon()
                # Fresh or stale, the writer's row is never settled ...
                assert read.horizon() < created_at
                assert read.horizon(previous) < created_at
                if read.own_start_ms is None:
                    stale.append(read)
            # ... for a stale snapshot misses both our transaction and the writer: it
            # lists only transactions older than both, which bound the horizon.
            for read in stale:
                assert read.seen.newest_start_ms is None or read.seen.newest_start_ms <= before
                assert read.horizon(previous) == max(previous, read.horizon())
        assert reads[0] > 100


def test_the_runner_reads_inside_a_started_transaction(
    register: Any, server_database: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every read, in a cycle and at shutdown, comes after the fence's locking read
    started the transaction: a fresh snapshot then lists the reader's own transaction."""
    reads: list[tuple[str, bool, int | None]] = []
    before: list[str] = []
    store_class = type(store_for(connection))
    original = store_class.write_horizon

    def spy(self: Any, cursor: Any) -> WriteHorizon | None:
        started = None
        if connection.vendor == "mysql" and connection.mysql_is_mariadb:
            cursor.execute("SELECT @@in_transaction")  # 1 once InnoDB's transaction started
            started = cursor.fetchone()[0]
        callers = {frame.name for frame in traceback.extract_stack()}
        site = "shutdown" if "shutdown" in callers else "_cycle"
        reads.append((site, connections["default"].in_atomic_block, started))
        # Under REPEATABLE READ the first plain read fixes the snapshot: the horizon must
        # be read before any, right after the fence's locking read.
        before.append(last_statement[threading.get_ident()])
        return original(self, cursor)

    last_statement: dict[int, str] = {}
    execute = CursorWrapper.execute

    def remember(self: Any, sql: Any, params: Any = None) -> Any:
        if "@@in_transaction" not in str(sql):
            last_statement[threading.get_ident()] = str(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(store_class, "write_horizon", spy)
    monkeypatch.setattr(CursorWrapper, "execute", remember)
    monkeypatch.setattr(horizon_module, "refresh_delay", lambda: 0.0)  # read at every use
    register("t", "g", lambda message: None)
    send_message("t", "a", partition_key="k")
    drain(["g"])  # --until-empty: the new row is not settled yet, so shutdown advances
    assert {site for site, _, _ in reads} == {"_cycle", "shutdown"}
    suffix = store_for(connection).locking_read_suffix.strip()
    assert before and all(sql.endswith(suffix) for sql in before), before
    assert all(in_atomic for _, in_atomic, _ in reads)
    if connection.vendor == "mysql" and connection.mysql_is_mariadb:
        assert all(started == 1 for _, _, started in reads), reads
