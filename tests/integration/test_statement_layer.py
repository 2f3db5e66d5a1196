"""The shared statement layer (sqlqueue.storage.statements): every builder, on the real
database, through both executors: Django's cursor, and the Spark data source's own
Django-free DB-API connection (mysqlclient, psycopg, sqlite3). A builder without a test
here fails ``test_every_shared_statement_is_tested``."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from django.db import connection

from sqlqueue import send_message
from sqlqueue.operations.flow import pause
from sqlqueue.storage.statements import Statement, Statements, statements_for
from sqlqueue.storage.statements.membership import MembershipStatements
from sqlqueue.storage.statements.vendors import MySQLVendor, OnConflictVendor, Vendor

pytestmark = pytest.mark.django_db(transaction=True)

#: the vendor hooks the builders are made of (tested through them), not statements
HOOKS = {"quote", "names", "marks", "upsert_clause", "insert_if_absent_suffix",
         "stored_columns", "partition_keys_cte", "partitions_filter", "parse_write_horizon"}


class Executor(Protocol):
    sql: Statements

    def run(self, statement: Statement) -> int: ...

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]: ...


class DjangoExecutor:
    def __init__(self) -> None:
        self.sql = statements_for(connection.vendor)

    def run(self, statement: Statement) -> int:
        with connection.cursor() as cursor:
            cursor.execute(*statement)
            return int(cursor.rowcount)

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(*statement)
            return [tuple(r) for r in cursor.fetchall()]


@pytest.fixture(params=["django", "spark"])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "django":
        yield DjangoExecutor()
        return
    from sqlqueue.integrations.spark.connect import Database
    from sqlqueue.spark import database_url

    with Database.from_url(database_url()).connect() as spark_connection:
        yield spark_connection  # type: ignore[misc]


def test_every_shared_statement_is_tested() -> None:
    source = Path(__file__).read_text()
    classes = (Vendor, MySQLVendor, OnConflictVendor, MembershipStatements)
    names = {name for cls in classes for name, value in vars(cls).items()
             if inspect.isfunction(value) and not name.startswith("_")} - HOOKS
    assert sorted(n for n in names if f"sql.{n}(" not in source) == []


def test_the_layer_imports_no_django() -> None:
    code = ("import sys, sqlqueue.storage.statements; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.strip() == "[]"


def test_heartbeats(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.heartbeat("g", "t", "one"))
    executor.run(sql.heartbeat("g", "t", "two"))
    executor.run(sql.heartbeat("g", "t", "one"))  # again: an upsert
    assert executor.rows(sql.live_subscribers("g", "t", 30_000)) == [("one",), ("two",)]
    executor.run(sql.deregister("g", "t", "two"))
    assert executor.rows(sql.live_subscribers("g", "t", 30_000)) == [("one",)]


def test_leases(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.acquire_leases("g", "t", ["a"], "first", 30_000))
    executor.run(sql.acquire_leases("g", "t", ["a", "b"], "second", 30_000))
    held = {r[0]: (r[1], int(r[2])) for r in executor.rows(sql.list_leases("g", "t"))}
    assert held == {"a": ("first", 1), "b": ("second", 1)}  # a live lease stays put
    # Five seconds without renewal; renewing brings only the owner's lease back to now.
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = "
                  "lease_renewed_at - 5000", []))
    assert executor.run(sql.renew_leases("g", "t", "second", 30_000)) == 1
    assert executor.run(sql.renew_leases("g", "t", "first", 30_000, ["b"])) == 0
    ages = {r[0]: int(r[3]) for r in executor.rows(sql.list_leases("g", "t", partitions=["a",
                                                                                         "b"]))}
    assert ages["b"] < 5000 <= ages["a"]
    # An expired lease is taken over with a new generation.
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = 0 "
                  "WHERE partition_key = 'a'", []))
    executor.run(sql.acquire_leases("g", "t", ["a"], "second", 30_000))
    locked = executor.rows(sql.list_leases("g", "t", lock=True, partitions=["a"],
                                           with_server="'here'"))
    assert [(r[0], r[1], int(r[2]), r[4]) for r in locked] == [("a", "second", 2, "here")]
    assert executor.run(sql.release_leases("g", "t", "second", ["a"])) == 1
    assert executor.run(sql.release_leases("g", "t", "second")) == 1
    assert executor.rows(sql.list_leases("g", "t")) == []


def test_purge_abandoned(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.acquire_leases("g", "t", ["a", "b"], "gone", 30_000))
    executor.run(sql.heartbeat("g", "t", "gone"))
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = 0 "
                  "WHERE partition_key = 'a'", []))
    executor.run(("UPDATE queue_subscriber_heartbeats SET heartbeat_at = 0", []))
    for statement in sql.purge_abandoned("g", "t", 60_000):
        executor.run(statement)
    assert [r[0] for r in executor.rows(sql.list_leases("g", "t"))] == ["b"]
    assert executor.rows(sql.live_subscribers("g", "t", 1 << 50)) == []


def test_discover_partitions_and_partition_heads(executor: Executor) -> None:
    sql = executor.sql
    offsets = {key: send_message("t", {}, partition_key=key).offset for key in "bca"}
    offsets["a"] = send_message("t", {}, partition_key="a").offset
    send_message("other", {}, partition_key="z")
    assert sorted(r[0] for r in executor.rows(sql.discover_partitions("t"))) == ["a", "b", "c"]
    heads = {r[0]: int(r[1]) for r in executor.rows(sql.partition_heads("t"))}
    assert heads == offsets
    assert executor.rows(sql.discover_partitions("nothing.here")) == []


def test_list_pauses(executor: Executor) -> None:
    assert executor.rows(executor.sql.list_pauses()) == []
    pause("g", "t")
    pause(topic="all.of.it")
    assert sorted(executor.rows(executor.sql.list_pauses())) == [("", "all.of.it"), ("g", "t")]


def test_write_horizon() -> None:
    """Read inside a transaction that has written a row (the executors' own rule)."""
    from django.db import transaction

    sql = statements_for(connection.vendor)
    statement = sql.write_horizon()
    if connection.vendor == "sqlite":
        assert statement is None  # one writer at a time: every visible row is settled
        return
    assert statement is not None
    with transaction.atomic(), connection.cursor() as cursor:
        send_message("t", {})
        cursor.execute(*statement)
        seen = sql.parse_write_horizon(cursor.fetchone())
        cursor.execute(*sql.database_now_ms())
        now_ms = int(cursor.fetchone()[0])
    if connection.vendor == "postgresql":
        # Exact: this writing transaction is listed, started before now, no margin.
        assert seen.oldest_writer_ms is not None and seen.oldest_writer_ms <= now_ms
        assert seen.margin_ms == 0
    else:
        # INNODB_TRX in whole seconds, as epoch ms; a snapshot may be up to 0.1 s stale,
        # so this transaction may be missing from it.
        for value in (seen.oldest_writer_ms, seen.newest_start_ms):
            assert value is None or (value % 1000 == 0 and value <= now_ms)
