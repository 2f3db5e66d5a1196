"""The shared statement layer (sqlqueue.storage.statements): every builder, on the real
database, through both executors: Django's cursor, and the Spark data source's own
Django-free DB-API connection (mysqlclient, psycopg, sqlite3). A builder without a test
here fails ``test_every_shared_statement_is_tested``."""

from __future__ import annotations

import hashlib
import inspect
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from django.db import connection, transaction

from sqlqueue import send_message
from sqlqueue.operations.flow import pause
from sqlqueue.storage.statements import (
    MySQLStatements,
    PostgreSQLStatements,
    SQLiteStatements,
    Statement,
    Statements,
    statements_for,
)
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite
from sqlqueue.storage.statements.delivery import OutcomeWrite
from sqlqueue.storage.statements.publishing import WAKEUP_CHANNEL, MessageRow
from sqlqueue.storage.statements.schedules import PublishedTick
from sqlqueue.storage.statements.sessions import MySQLSessions, PostgreSQLSessions

pytestmark = pytest.mark.django_db(transaction=True)

#: the vendor hooks the builders are made of (tested through them), not statements
HOOKS = {"quote", "names", "marks", "text_marks", "upsert_clause", "insert_if_absent_suffix",
         "stored_columns", "partition_keys_cte", "partitions_filter", "parse_write_horizon",
         "message_clock_sql", "greatest_sql", "union_member", "seek_sql", "topics_cte",
         "ms_since_sql"}


class Executor(Protocol):
    sql: Statements

    def run(self, statement: Statement) -> int: ...

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]: ...

    def transaction(self) -> AbstractContextManager[None]: ...

    def copy_rows(self, statement: Statement, rows: Iterable[Sequence[Any]]) -> None: ...


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

    def transaction(self) -> AbstractContextManager[None]:
        return transaction.atomic()

    def copy_rows(self, statement: Statement, rows: Iterable[Sequence[Any]]) -> None:
        """PostgreSQL's COPY, through psycopg's cursor under Django's."""
        with connection.cursor() as cursor, cursor.cursor.copy(*statement) as copy:
            for row in rows:
                copy.write_row(row)


# The Spark side is marked spark: its connection layer needs the spark extra
# (sqlqueue.spark imports PySpark), which the Django 5.2 stack (make test-lts) leaves out.
@pytest.fixture(params=["django", pytest.param("spark", marks=pytest.mark.spark)])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "django":
        yield DjangoExecutor()
        return
    from sqlqueue.integrations.spark.connect import Database
    from sqlqueue.spark import database_url

    with Database.from_url(database_url()).connect() as spark_connection:
        yield spark_connection  # type: ignore[misc]


def shared_builders() -> set[str]:
    """Every public method the shared layer's classes define (the vendors' too)."""
    classes = {cls for vendor in (MySQLStatements, SQLiteStatements, PostgreSQLStatements)
               for cls in vendor.__mro__
               if cls.__module__.startswith("sqlqueue.storage.statements")}
    return {name for cls in classes for name, value in vars(cls).items()
            if (inspect.isfunction(value) or isinstance(value, staticmethod | property))
            and not name.startswith("_")} - HOOKS


def test_every_shared_statement_is_tested() -> None:
    source = Path(__file__).read_text()
    assert {"fetch_messages", "heartbeat", "claim_ticks", "offset_counter"} <= shared_builders()
    assert sorted(n for n in shared_builders() if f"sql.{n}(" not in source) == []


def test_the_layer_imports_no_django() -> None:
    code = ("import sys, sqlqueue.storage.statements, sqlqueue.storage.retry; "
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
    assert executor.run(sql.renew_leases("g", "t", "second", {"b": 1})) == 1
    assert executor.run(sql.renew_leases("g", "t", "first", {"b": 1})) == 0
    ages = {r[0]: int(r[3]) for r in executor.rows(sql.list_leases("g", "t", partitions=["a",
                                                                                         "b"]))}
    assert ages["b"] < 5000 <= ages["a"]
    # A renewal stamped after this statement's now (another runner's, committed while it
    # ran) reads as a negative age, not an error (MySQL: unsigned columns, error 1690).
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = "
                  "lease_renewed_at + 60000 WHERE partition_key = 'b'", []))
    ages = {r[0]: int(r[3]) for r in executor.rows(sql.list_leases("g", "t"))}
    assert ages["b"] < 0
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = "
                  "lease_renewed_at - 60000 WHERE partition_key = 'b'", []))
    # An expired lease nobody took is extended by its holder, at its generation (the
    # holder stalled: what it did meanwhile is still its to record).
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = 0 "
                  "WHERE partition_key = 'a'", []))
    assert executor.run(sql.renew_leases("g", "t", "first", {"a": 1})) == 1
    assert int(executor.rows(sql.list_leases("g", "t", partitions=["a"]))[0][3]) < 5000
    # An expired lease is taken over with a new generation; its former holder's renewal
    # then finds nothing to extend.
    executor.run(("UPDATE queue_partition_leases SET lease_renewed_at = 0 "
                  "WHERE partition_key = 'a'", []))
    executor.run(sql.acquire_leases("g", "t", ["a"], "second", 30_000))
    assert executor.run(sql.renew_leases("g", "t", "first", {"a": 1})) == 0
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


def test_the_log_pages_reads(executor: Executor) -> None:
    """Topics and partitions by a loose index scan, a search's lookups in any number of
    topics, each one statement (issue 52)."""
    sql = executor.sql
    assert executor.rows(sql.log_topics(10)) == []
    sent = {(topic, key): [send_message(topic, {}, partition_key=key, id=f"i{n}").offset
                           for n in range(3)]
            for topic in ("b.t", "a.t", "c.t") for key in ("y", "x")}
    assert [r[0] for r in executor.rows(sql.log_topics(10))] == ["a.t", "b.t", "c.t"]
    assert [r[0] for r in executor.rows(sql.log_topics(2))] == ["a.t", "b.t"]
    assert [tuple(r) for r in executor.rows(sql.log_partitions(10))] == [
        ("a.t", "x"), ("a.t", "y"), ("b.t", "x"), ("b.t", "y"), ("c.t", "x"), ("c.t", "y")]
    assert len(executor.rows(sql.log_partitions(3))) == 3
    newest = sorted(int(r[0]) for r in executor.rows(sql.newest_of_key(["a.t", "c.t"], "x", 2)))
    assert newest == sorted(sent["a.t", "x"][1:] + sent["c.t", "x"][1:])
    assert executor.rows(sql.newest_of_key(["a.t"], "nothing", 2)) == []
    found = executor.rows(sql.offsets_of_id([("a.t", ["x", "y"]), ("b.t", ["y"])], "i1"))
    assert sorted(int(r[0]) for r in found) == sorted(
        [sent["a.t", "x"][1], sent["a.t", "y"][1], sent["b.t", "y"][1]])
    assert executor.rows(sql.offsets_of_id([("a.t", ["x"])], "no-such-id")) == []
    counts = executor.rows(sql.topic_counts(["a.t", "c.t", "none"], 4))
    assert sorted((r[0], int(r[1])) for r in counts) == [("a.t", 4), ("c.t", 4), ("none", 0)]
    heads = [(r[0], r[1], int(r[2])) for r in executor.rows(sql.log_heads(10))]
    assert heads == [(t, k, max(sent[t, k])) for t, k in sorted(sent)]
    assert len(executor.rows(sql.log_heads(4))) == 4


def test_list_pauses(executor: Executor) -> None:
    assert executor.rows(executor.sql.list_pauses()) == []
    pause("g", "t")
    pause(topic="all.of.it")
    assert sorted(executor.rows(executor.sql.list_pauses())) == [("", "all.of.it"), ("g", "t")]


def test_runner_requests(executor: Executor) -> None:
    from sqlqueue.operations.runners import request_runner_stop

    sql = executor.sql
    assert executor.rows(sql.runner_request("web-1.42")) == []
    executor.run(sql.heartbeat("g", "t", "web-1.42"))
    at = request_runner_stop("web-1.42", "drain", by="ops").requested_at_ms
    assert executor.rows(sql.runner_request("web-1.42")) == [("drain", "ops", at)]
    assert executor.run(sql.obey_runner_request("web-1.42", at + 1)) == 0  # a newer one
    assert executor.run(sql.obey_runner_request("web-1.42", at)) == 1
    assert executor.rows(sql.runner_request("web-1.42")) == []


def test_runner_stops(executor: Executor) -> None:
    """Trial F16: a runner that stopped for a cause writes its row (replacing its last);
    rows older than the kept window are forgotten, a request not obeyed yet is kept."""
    from sqlqueue.models import RunnerRequest

    sql = executor.sql
    executor.run(sql.record_runner_stop("web-1.42", "drain", "signal", "SIGTERM", 1500))
    row = RunnerRequest.objects.get(runner_name="web-1.42")
    assert (row.action, row.cause, row.requested_by) == ("drain", "signal", "SIGTERM")
    assert row.obeyed_at - row.requested_at == 1500
    assert executor.rows(sql.runner_request("web-1.42")) == []  # nothing for it to obey
    executor.run(sql.record_runner_stop("web-1.42", "stop", "recycle", "--max-memory", 0))
    row = RunnerRequest.objects.get(runner_name="web-1.42")
    assert (row.action, row.cause, row.requested_by) == ("stop", "recycle", "--max-memory")
    RunnerRequest.objects.create(runner_name="web-2.7", action="drain", requested_at=1)
    assert executor.run(sql.forget_runner_stops(60_000)) == 0  # both are recent or pending
    RunnerRequest.objects.filter(runner_name="web-1.42").update(obeyed_at=row.obeyed_at - 61_000)
    assert executor.run(sql.forget_runner_stops(60_000)) == 1
    assert list(RunnerRequest.objects.values_list("runner_name", flat=True)) == ["web-2.7"]


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


# -- delivery (sqlqueue.storage.statements.delivery) -------------------------------------
def state(executor: Executor, offset: int) -> tuple[Any, ...] | None:
    found = executor.rows((
        "SELECT acked, invisible_until, retry_count, last_error FROM queue_delivery_state "
        "WHERE consumer_group = 'g' AND message_offset = %s", [offset]))
    return (bool(found[0][0]), *found[0][1:]) if found else None


def test_fetch_messages_and_offsets(executor: Executor) -> None:
    sql = executor.sql
    assert executor.rows(sql.head_offset()) == [(None,)]
    sent = [send_message("t", {"n": n}, partition_key="k").offset for n in range(4)]
    newest = send_message("t", {}, partition_key="other").offset
    rows = executor.rows(sql.fetch_messages("g", "t", "k", sent[0], 2))
    assert [int(r[0]) for r in rows] == sent[1:3]
    assert [r[10:] for r in rows] == [(None, None, None)] * 2  # never delivered
    many = executor.rows(sql.fetch_partitions("g", "t", [("k", sent[1]), ("other", 0)], 1))
    assert sorted((r[13], int(r[0])) for r in many) == [("k", sent[2]), ("other", newest)]
    assert {r[0] for r in executor.rows(sql.partitions_with_rows("t", sent[2], newest))} \
        == {"k", "other"}
    assert executor.rows(sql.partitions_with_rows("t", newest, newest + 1)) == []
    at = executor.rows(sql.fetch_messages_at("g", "t", "k", [sent[3], sent[0]]))
    assert [int(r[0]) for r in at] == [sent[0], sent[3]]
    assert [(int(r[0]), r[1]) for r in executor.rows(sql.partition_rows(
        ("offset", "partition_key"), "t", "k", sent[0], sent[2], 10))] == [
        (sent[1], "k"), (sent[2], "k")]
    head, server = executor.rows(sql.head_offset(with_server="'here'"))[0]
    assert (int(head), server) == (newest, "here")


def test_delivery_state_writes(executor: Executor) -> None:
    sql = executor.sql
    a, b = (send_message("t", {}, partition_key="k").offset for _ in range(2))
    executor.run(sql.mark_delivered("g", "t", [("k", a, 10**15), ("k", b, 10**15)]))
    executor.run(sql.mark_delivered("g", "t", [("k", b, 10**15)]))  # a redelivery
    assert state(executor, a) == (False, 10**15, 0, "")
    assert state(executor, b)[2] == 1  # type: ignore[index]
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("k", a, True, 0),
                                               OutcomeWrite("k", b, False, 5, "boom")]))
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("k", a, False, 7, "late")]))
    assert state(executor, a) == (True, 0, 0, "")  # an acked row stays acked
    assert state(executor, b) == (False, 5, 1, "boom")
    assert executor.run(sql.extend_visibility("g", "t", "k", b, 60_000)) == 1
    assert executor.run(sql.extend_visibility("g", "t", "k", a, 60_000)) == 0  # acked
    extended = state(executor, b)[1]  # type: ignore[index]  # now + 60 s
    executor.run(sql.restamp_visibility("g", "t", [("k", a), ("k", b), ("j", b)], 90_000))
    assert state(executor, a) == (True, 0, 0, "")  # acked: untouched
    assert state(executor, b)[1] >= extended + 30_000  # type: ignore[index]  # now + 90 s
    pairs = [("k", a), ("k", b), ("j", a)]
    locked = sql.acked_among("g", "t", pairs, lock=True)  # the fetcher's read-back
    assert [tuple(r) for r in executor.rows(locked)] == [("k", a)]
    assert executor.run(sql.ack_deliveries("g", "t", [("k", b, 0)])) == 0  # delivered again
    # Acked already: matched (Django's MySQL connections count rows matched, FOUND_ROWS),
    # and left as it was.
    executor.run(sql.ack_deliveries("g", "t", [("k", a, 0)]))
    assert state(executor, a) == (True, 0, 0, "")
    assert state(executor, b)[0] is False  # type: ignore[index]
    executor.run(sql.give_back("g", "t", [("k", b)], 0))
    assert state(executor, b) == (False, 0, 0, "boom")
    executor.run(sql.give_back("g", "t", [("k", b)], None))
    assert state(executor, b) is None
    executor.run(sql.give_back("g", "t", [("k", a), ("k", b)], None))
    assert state(executor, a) is not None  # acked: never given back
    executor.run(sql.mark_delivered("g", "t", [("k", b, 10**15)]))
    assert executor.run(sql.ack_deliveries("g", "t", [("k", b, 0), ("j", b, 0)])) == 1
    assert state(executor, b) == (True, 0, 0, "")


def test_runs_in_flight(executor: Executor) -> None:
    sql = executor.sql
    a, b, c = (send_message("t", {}, partition_key="k").offset for _ in range(3))
    d = send_message("t", {}, partition_key="j").offset
    far, farther = 10**15, 10**15 + 5
    executor.run(sql.mark_delivered("g", "t", [("k", a, farther), ("k", b, far),
                                               ("k", c, 1), ("j", d, far)]))
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("j", d, True, 0)]))
    # In flight above the watermark, not acked, not visible yet: the latest timeout.
    assert sorted((p, int(u)) for p, u in executor.rows(sql.runs_in_flight(
        "g", "t", [("k", 0), ("j", 0)]))) == [("k", farther)]
    assert [(p, int(u)) for p, u in executor.rows(sql.runs_in_flight(
        "g", "t", [("k", a)]))] == [("k", far)]  # a is at or below the watermark
    assert executor.rows(sql.runs_in_flight("g", "t", [("k", b)])) == []  # c: visible
    assert executor.rows(sql.runs_in_flight("other", "t", [("k", 0)])) == []


def test_dead_letters_and_replays(executor: Executor) -> None:
    sql = executor.sql
    offset = send_message("t", {"n": 1}, partition_key="k").offset
    for attempts in (3, 4):  # dead-lettered again: the row is updated
        executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group="g", letters=[
            DeadLetterWrite(offset, "dl-1", attempts, "boom", '{"why": 1}')]))
    assert executor.rows(("SELECT failure_count, original_topic, consumer_group "
                          "FROM queue_messages WHERE topic = 't.dlq'", [])) == [(4, "t", "g")]
    assert executor.rows(sql.dead_letter_counts("t.dlq", "g", 10)) == [("k", 1)]
    tallies = executor.rows(sql.dead_letter_tallies([("t.dlq", "g"), ("t.dlq", "other"),
                                                     ("none.dlq", "g")], 10))
    assert [(r[0], r[1], r[2], int(r[3])) for r in tallies] == [("t.dlq", "g", "k", 1)]
    ((dead,),) = executor.rows(sql.head_offset())
    executor.run(sql.insert_replay(dead_letter_offset=int(dead), replay_id="r-1",
                                   detail='{"replayed": 1}'))
    assert executor.rows(("SELECT topic, partition_key, consumer_group FROM queue_messages "
                          "WHERE id = 'r-1'", [])) == [("t", "k", "g")]


def test_many_dead_letters_and_replays_in_one_statement(executor: Executor) -> None:
    """Dead letters of several partitions in one statement, in offset order, a duplicate
    id updating its row; their replays in one statement, in the dead letters' order;
    then the dead letters deleted (nothing else)."""
    sql = executor.sql
    sent = [send_message("t", {"n": n}, partition_key="ab"[n % 2], id=f"m{n}").offset
            for n in range(6)]
    letters = [DeadLetterWrite(o, f"m{n}@g", 2, f"boom {n}", f'{{"n": {n}}}')
               for n, o in reversed(list(enumerate(sent)))]  # any order given
    executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group="g",
                                         letters=letters))
    executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group="g", letters=[
        DeadLetterWrite(sent[0], "m0@g", 3, "again", '{"n": 0}')]))  # updated, not added
    q = sql.quote("offset")
    dead = executor.rows((f"SELECT {q}, id, partition_key, failure_count, last_error, "
                          f"original_topic, consumer_group FROM queue_messages "
                          f"WHERE topic = 't.dlq' ORDER BY {q}", []))
    assert [(r[1], r[2], r[3], r[4]) for r in dead] == [
        ("m0@g", "a", 3, "again"), *((f"m{n}@g", "ab"[n % 2], 2, f"boom {n}")
                                     for n in range(1, 6))]
    assert {(r[5], r[6]) for r in dead} == {("t", "g")}
    assert [int(r[0]) for r in dead] == sorted(int(r[0]) for r in dead)
    assert executor.run(sql.delete_dead_letters([int(r[0]) for r in dead])) == 6


def test_replays_are_copied_straight_from_the_dead_letters() -> None:
    """``insert_replays`` of dead letters given in any order: one statement, in the dead
    letters' order, ids and details made by the statement (the detail's id, or the
    row's own; SHA-256 of a long one); ``dead_letter_keys`` walks them partition by
    partition; ``delete_dead_letters`` removes them (nothing else). Django's connection
    only: replays are the admin's and the commands' (SQLite: Django's SHA256)."""
    executor = DjangoExecutor()
    sql = executor.sql
    long_id = "é" * 125  # 250 bytes: with "~replay-<offset>" past 255
    ids = ["m0", "m1", "m2", long_id, "m4", "m5"]
    sent = [send_message("t", {"n": n}, partition_key="ab"[n % 2], id=ids[n]).offset
            for n in range(6)]
    executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group="g", letters=[
        DeadLetterWrite(o, f"dl{n}@g", 2, "boom",
                        json.dumps({"id": ids[n], "offset": o} if n != 5 else [5]))
        for n, o in enumerate(sent)]))
    q = sql.quote("offset")
    dead = [int(r[0]) for r in executor.rows((
        f"SELECT {q} FROM queue_messages WHERE topic = 't.dlq' ORDER BY {q}", []))]
    walk = executor.rows(sql.dead_letter_keys("t.dlq", None, 2))
    assert [(int(o), k) for o, k in walk] == [(dead[0], "a"), (dead[2], "a")]
    walk = executor.rows(sql.dead_letter_keys("t.dlq", ("a", dead[2]), 10))
    assert [(int(o), k) for o, k in walk] == [(dead[4], "a"), (dead[1], "b"), (dead[3], "b"),
                                              (dead[5], "b")]
    assert executor.run(sql.insert_replays(list(reversed(dead)))) == 6
    replayed = executor.rows((f"SELECT id, partition_key, consumer_group, failure_detail "
                              f"FROM queue_messages WHERE topic = 't' AND consumer_group = 'g' "
                              f"ORDER BY {q}", []))
    digest = hashlib.sha256(long_id.encode()).hexdigest()
    assert [r[0] for r in replayed] == [
        f"m0~replay-{dead[0]}", f"m1~replay-{dead[1]}", f"m2~replay-{dead[2]}",
        f"sha256:{digest}~replay-{dead[3]}", f"m4~replay-{dead[4]}",
        f"dl5@g~replay-{dead[5]}"]  # a detail without an id: the dead letter's own
    assert [(r[1], r[2]) for r in replayed] == [("ab"[n % 2], "g") for n in range(6)]
    details = [r[3] if isinstance(r[3], dict) else json.loads(r[3]) for r in replayed]
    assert details[0] == {"replay_of": {"id": "m0", "offset": sent[0],
                                        "dead_letter_offset": dead[0]}}
    assert details[5] == {"replay_of": {"id": "dl5@g", "offset": None,
                                        "dead_letter_offset": dead[5]}}
    assert executor.run(sql.delete_dead_letters([*dead, sent[0]])) == 6
    assert executor.rows(("SELECT COUNT(*) FROM queue_messages WHERE topic = 't.dlq'",
                          [])) == [(0,)]
    assert executor.rows(("SELECT COUNT(*) FROM queue_messages WHERE topic = 't'",
                          [])) == [(12,)]  # the originals stay (not dead letters)


# -- watermarks (sqlqueue.storage.statements.watermarks) --------------------------------------
def test_watermarks(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.ensure_watermarks("g", "t", ["a", "b"], 4))
    executor.run(sql.ensure_watermarks("g", "t", ["a"]))  # existing rows stay
    executor.run(sql.ensure_watermarks("h", "t", ["a"]))
    assert sorted(executor.rows(sql.group_watermarks("g", "t"))) == [("a", 4), ("b", 4)]
    assert executor.run(sql.advance_partition_watermarks("g", "t", [("a", 9, 11)])) == 1
    assert executor.run(sql.advance_watermarks("g", "t", 6)) == 1  # b only: never back
    assert executor.rows(sql.group_watermarks("g", "t", ["a"])) == [("a", 9)]
    assert sorted(executor.rows(sql.topic_watermarks("t"))) == [
        ("g", "a", 9), ("g", "b", 6), ("h", "a", 0)]
    for offset in (5, 9, 10):
        executor.run(sql.mark_delivered("g", "t", [("a", offset, 0)]))
    assert executor.run(sql.delete_states_upto("g", "t", [("a", 9)])) == 2
    assert executor.run(sql.advance_partition_watermarks(
        "g", "t", [("a", 12, None), ("b", 5, 7)])) == 1  # a only: b never back
    assert sorted(executor.rows(sql.group_watermarks("g", "t"))) == [("a", 12), ("b", 6)]



# -- garbage collection (the vendors') --------------------------------------------------------
def test_garbage_collection(executor: Executor) -> None:
    sql = executor.sql
    sent = [send_message("t", {}, partition_key="k", id=f"m{n}").offset for n in range(5)]
    counter = executor.rows(sql.offset_counter())
    assert counter and int(counter[0][0]) >= sent[-1]
    assert executor.run(sql.delete_messages_upto("t", "k", sent[3], 2)) == 2
    assert executor.run(sql.delete_messages_upto("t", "k", sent[3], 10)) == 2
    assert [int(r[0]) for r in executor.rows(
        sql.partition_rows(("offset",), "t", "k", 0, 10**12, 10))] == [sent[4]]
    assert sorted((p, int(o)) for p, o in executor.rows(sql.partition_offsets(
        "t", [("k", 0, 10**12), ("x", 0, 10**12)], 10))) == [("k", sent[4])]
    executor.run(("INSERT INTO queue_idempotency_keys (key_high, key_low, message_offset, "
                  "expires_at) VALUES (1, 1, 1, 0), (2, 2, 2, 0), (3, 3, 3, %s)", [1 << 60]))
    assert executor.run(sql.delete_expired_idempotency_keys(1)) == 1
    assert executor.run(sql.delete_expired_idempotency_keys(10)) == 1


def test_garbage_collection_by_windows(executor: Executor) -> None:
    """A window of the primary key, each partition up to its own limit; partitions not
    named and other topics keep their rows."""
    sql = executor.sql
    sent = {(topic, key, n): send_message(topic, {}, partition_key=key, id=f"{key}-{n}").offset
            for n in range(4) for topic in ("t", "u") for key in ("a", "b", "c")}
    first, last = min(sent.values()), max(sent.values())
    limits = [("a", sent["t", "a", 2]), ("b", sent["t", "b", 0])]
    assert executor.run(sql.delete_messages_in_window("t", first - 1, sent["t", "a", 1],
                                                      limits)) == 3  # a0, a1, b0
    assert executor.run(sql.delete_messages_in_window("t", sent["t", "a", 1], last,
                                                      limits)) == 1  # a2
    left = {(topic, key, n) for (topic, key, n), offset in sent.items()
            if executor.rows(("SELECT 1 FROM queue_messages WHERE " + executor.sql.quote(
                "offset") + " = %s", [offset]))}
    gone = {("t", "a", 0), ("t", "a", 1), ("t", "a", 2), ("t", "b", 0)}
    assert left == set(sent) - gone


# -- operating (sqlqueue.storage.statements.operating) -----------------------------------------
def test_operating_reads(executor: Executor) -> None:
    sql = executor.sql
    a = [send_message("t", {}, partition_key="a").offset for _ in range(3)]
    b = send_message("t", {}, partition_key="b").offset
    summary = executor.rows(sql.pending_summary("t", "g", [("a", a[0]), ("b", b)], 10))
    assert {r[0]: int(r[1]) for r in summary} == {"a": 2, "b": 0}
    assert {r[0]: r[2] is None for r in summary} == {"a": False, "b": True}
    uncounted = executor.rows(sql.pending_summary("t", "g", [("a", 0)], None))
    assert uncounted[0][:2] == ("a", None)
    c = send_message("u", {}, partition_key="c").offset
    many = executor.rows(sql.pending_summaries(
        [("t", "g", "a", a[0]), ("u", "h", "c", 0), ("u", "h", "c", c)], 10))
    assert sorted((r[0], r[1], r[2], int(r[3]), r[4] is None) for r in many) == [
        ("t", "g", "a", 2, False), ("u", "h", "c", 0, True), ("u", "h", "c", 1, False)]
    assert [r[3] for r in executor.rows(sql.pending_summaries([("u", "h", "c", 0)],
                                                              None))] == [None]
    assert [None if v is None else int(v) for v in executor.rows(
        sql.first_offsets_above("t", [("a", a[0]), ("b", b)]))[0]] == [a[1], None]
    dues = {int(r[0]): r[2] for r in executor.rows(sql.message_dues([a[0], b]))}
    assert dues == {a[0]: "", b: ""}
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("a", a[1], True, 0)]))
    assert [(r[0], int(r[1])) for r in executor.rows(
        sql.acked_among("g", "t", [("a", a[1]), ("a", a[2])]))] == [("a", a[1])]


def test_the_reads_of_many_partitions_planned_once(executor: Executor) -> None:
    """``pending_where_cheap`` answers a probe of a small partition (all counted) or of a
    partition wholly above its watermark (``cap``), and leaves the others (NULL);
    ``dead_letters_if_few`` counts a pair with fewer than ``cap`` dead letters and marks
    the others. Names compare as the tables' binary collation does ("T" is not "t")."""
    sql = executor.sql
    a = [send_message("t", {}, partition_key="a").offset for _ in range(2)]
    b = [send_message("t", {}, partition_key="b").offset for _ in range(4)]
    # A replay for another group first in c: the group's first pending is the next one.
    send_message("t", {}, partition_key="c", id="for-other")
    executor.run(("UPDATE queue_messages SET consumer_group = 'other' "
                  "WHERE id = 'for-other'", []))
    c = send_message("t", {}, partition_key="c").offset
    dues = {int(r[0]): int(r[1]) for r in executor.rows(sql.message_dues([a[0], b[0], c]))}
    rows = executor.rows(sql.pending_where_cheap([
        ("t", "g", "a", 0), ("t", "g", "a", a[1]), ("t", "g", "b", 0), ("t", "g", "b", b[1]),
        ("T", "g", "a", 0), ("t", "g", "c", 0)], 3))
    assert sorted((int(r[0]), None if r[1] is None else int(r[1]),
                   None if r[2] is None else int(r[2])) for r in rows) == [
        (0, 2, dues[a[0]]), (1, 0, None), (2, 3, dues[b[0]]), (3, None, None), (4, 0, None),
        (5, 2, dues[c])]
    for group, sent in (("g", a[:1] + b[:1]), ("h", b[1:4])):
        executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group=group, letters=[
            DeadLetterWrite(o, f"dl-{group}-{o}", 3, "boom", "{}") for o in sent]))
    tallies = executor.rows(sql.dead_letters_if_few(
        [("t.dlq", "g"), ("t.dlq", "h"), ("none.dlq", "g"), ("T.dlq", "g")], 3))
    assert sorted((int(r[0]), r[1], int(r[2])) for r in tallies
                  if r[1] is not None) == [(0, "a", 1), (0, "b", 1)]
    assert [int(r[0]) for r in tallies if r[1] is None] == [1]


def test_postgresql_jit_for_the_transaction() -> None:
    """``set_jit``: the setting for the rest of the transaction, and the one before."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own statement")
    sql = DjangoExecutor().sql
    assert isinstance(sql, PostgreSQLStatements)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        (before,) = cursor.fetchone()
        cursor.execute(*sql.set_jit("off"))
        assert cursor.fetchone() == (before, "off")
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == (before,)  # the transaction's only


# -- schedules (sqlqueue.storage.statements.schedules) -----------------------------------------
def test_schedules(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.ensure_schedule("a", 100, "every 60s"))
    executor.run(sql.ensure_schedule("b", 200, "every 1s"))
    executor.run(sql.ensure_schedule("a", 999, "changed"))  # an existing row stays
    assert [r[:3] for r in executor.rows(sql.read_schedules())] in (
        [("a", 100, "every 60s"), ("b", 200, "every 1s")],
        [("b", 200, "every 1s"), ("a", 100, "every 60s")])
    assert executor.run(sql.claim_ticks("a", 100, 160, "every 60s")) == 1
    assert executor.run(sql.claim_ticks("a", 100, 220, "every 60s")) == 0
    executor.run(sql.record_tick("a", PublishedTick(160, "t", "k", 42, "schedule:a:x")))
    (row,) = executor.rows(sql.read_schedules(["a"], lock=True))
    assert (row[1], *row[3:8]) == (160, 160, "t", "k", 42, "schedule:a:x")
    assert row[8] is not None
    assert executor.run(sql.delete_schedule("b")) == 1
    assert executor.run(sql.delete_schedule("b")) == 0


# -- publishing (sqlqueue.storage.statements.publishing) ---------------------------------------
def message(key: str, mid: str, delay_ms: int | None = None) -> MessageRow:
    return MessageRow("t", key, mid, b'{"n": 1}', None, 1000, 0, delay_ms, 0)


def test_store_and_find_messages(executor: Executor) -> None:
    sql = executor.sql
    if connection.vendor == "postgresql":
        stored = executor.rows(sql.store_messages([message("k", "a"), message("k", "b", 50)]))
        offsets = {r[2]: int(r[0]) for r in stored}
    else:
        executor.run(sql.store_messages([message("k", "a"), message("k", "b", 50)]))
        offsets = {r[2]: int(r[0]) for r in executor.rows(
            sql.select_message_offsets("t", [("k", "a"), ("k", "b")]))}
    found = executor.rows(sql.select_message_offsets("t", [("k", "b"), ("k", "z"),
                                                           ("x", "a")], lock=True))
    assert [(int(r[0]), r[1], r[2]) for r in found] == [(offsets["b"], "k", "b")]
    (created, due), = executor.rows((
        "SELECT created_at, deliver_after FROM queue_messages WHERE id = 'b'", []))
    assert int(due) == int(created) + 50


def test_idempotency_keys(executor: Executor) -> None:
    sql = executor.sql
    executor.run(sql.remember_idempotency_keys([(1, 2, 10), (3, 4, 11)], 60_000))
    executor.run(sql.remember_idempotency_keys([(1, 2, 12)], 60_000))  # replaced
    assert sorted(executor.rows(sql.select_idempotency_keys([1, 3, 5], lock=False))) == [
        (1, 2, 12), (3, 4, 11)]
    executor.run(sql.remember_idempotency_keys([(5, 6, 13)], -1))  # its window passed
    assert executor.rows(sql.select_idempotency_keys([5], lock=True)) == []
    assert executor.run(sql.delete_expired_idempotency_keys(10)) == 1


def test_postgresql_publishing() -> None:
    """PostgreSQL's own: skip stored keys and take back, COPY with reserved offsets,
    NOTIFY heard by a LISTEN, the horizon's privileges."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own statements")
    from django.db import transaction

    sql = DjangoExecutor().sql
    assert isinstance(sql, PostgreSQLStatements)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*sql.store_messages([message("k", "a")]))
        cursor.execute(*sql.store_messages([message("k", "a"), message("k", "b")],
                                           skip_stored=True))
        ((offset, _, mid),) = cursor.fetchall()
        assert mid == "b"
        cursor.execute(*sql.delete_inserted_messages([offset]))
        assert cursor.rowcount == 1
        cursor.execute(*sql.reserve_offsets(2))
        now_ms, reserved = cursor.fetchone()
        with cursor.cursor.copy(sql.copy_messages()[0]) as copy:
            for n, reserved_offset in enumerate(reserved):
                copy.write_row((reserved_offset, "t", "k", f"c{n}", b"{}", None, now_ms, 1,
                                0, 0))
        cursor.execute("SELECT COUNT(*) FROM queue_messages WHERE id LIKE 'c%%'")
        assert cursor.fetchone()[0] == 2
        cursor.execute(*sql.horizon_privileges())
        assert cursor.fetchone()[0] in (True, False)
    listen, args = sql.listen_wakeups()
    assert (listen, args) == (f'LISTEN "{WAKEUP_CHANNEL}"', [])
    with connection.cursor() as cursor:
        cursor.execute(listen)
        cursor.execute(*sql.notify_wakeup("orders"))
        heard = next(connection.connection.notifies(timeout=5, stop_after=1))
        cursor.execute(*sql.notify_heartbeat())
        beat = next(connection.connection.notifies(timeout=5, stop_after=1))
        cursor.execute(f'UNLISTEN "{WAKEUP_CHANNEL}"')
    assert (heard.channel, heard.payload) == (WAKEUP_CHANNEL, "orders")
    assert (beat.channel, beat.payload) == (WAKEUP_CHANNEL, "")  # never a topic


def test_postgresql_prepared_message_insert() -> None:
    """The one-message INSERT prepared in the session: stored by EXECUTE, skipping a
    stored key, notifying the row's topic; the session's pid is the connection's."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own statements")
    import psycopg

    sql = DjangoExecutor().sql
    assert isinstance(sql, PostgreSQLStatements)
    connection.ensure_connection()
    # EXECUTE takes its values as literals: client-side binding, whichever Django uses.
    with psycopg.ClientCursor(connection.connection) as cursor:
        cursor.execute(*sql.server_session_pid())
        assert cursor.fetchone()[0] == connection.connection.info.backend_pid
        cursor.execute(*sql.prepare_stored_message("t_plain", skip_stored=False, wake=False))
        cursor.execute(*sql.prepare_stored_message("t_skip", skip_stored=True, wake=True))
        try:
            cursor.execute(*sql.execute_stored_message("t_plain", message("k", "p1")))
            ((offset,),) = cursor.fetchall()  # one row: its offset alone
            cursor.execute(f'LISTEN "{WAKEUP_CHANNEL}"')
            cursor.execute(*sql.execute_stored_message("t_skip", message("k", "p1")))
            assert cursor.fetchall() == []  # stored already: skipped, nothing notified
            cursor.execute(*sql.execute_stored_message("t_skip", message("k", "p2")))
            ((second, _notified),) = cursor.fetchall()
            cursor.execute("SELECT partition_key, id FROM queue_messages WHERE \"offset\" = %s",
                           [second])
            assert cursor.fetchone() == ("k", "p2")
            heard = list(connection.connection.notifies(timeout=5, stop_after=1))
            cursor.execute(f'UNLISTEN "{WAKEUP_CHANNEL}"')
            cursor.execute("SELECT \"offset\", created_at FROM queue_messages WHERE id = 'p1'")
            stored_offset, created_at = cursor.fetchone()
            assert stored_offset == offset and created_at > 0  # the database's clock
        finally:
            cursor.execute("DEALLOCATE t_plain")
            cursor.execute("DEALLOCATE t_skip")
    assert [(n.channel, n.payload) for n in heard] == [(WAKEUP_CHANNEL, "t")]


# -- sessions (sqlqueue.storage.statements.sessions) --------------------------------------------
def test_oldest_writer(executor: Executor) -> None:
    """Another session's open write transaction, the oldest, with its session, database,
    start, state, statement and age (tests/integration/test_exit_names_the_holder.py
    opens one; here, whatever this server has: none of this database's on PostgreSQL,
    where nothing else writes to the test's database now)."""
    statement = executor.sql.oldest_writer()
    if connection.vendor == "sqlite":
        assert statement is None  # one writer at a time: nothing holds a horizon back
        return
    assert statement is not None
    rows = executor.rows(statement)
    assert len(rows) <= 1 and all(len(row) == 7 for row in rows)
    if connection.vendor == "postgresql":
        assert rows == []


def test_session_statements(executor: Executor) -> None:
    sql = executor.sql
    bound, galera = sql.bound_lock_waits(7), sql.galera()
    local = sql.bound_transaction_lock_waits(3)
    idle = sql.bound_idle_transactions(7_000)
    if connection.vendor == "sqlite":
        # the busy timeout; no cluster; nothing ends an idle transaction (one process)
        assert (bound, galera, local, idle) == (None, None, None, None)
        return
    assert bound is not None and idle is not None
    executor.run(bound)
    _check_idle_transactions_bounded(executor, idle)
    if connection.vendor == "postgresql":
        assert executor.rows(("SHOW lock_timeout", [])) == [("7s",)]
        assert local is not None
        executor.run(local)  # in a transaction of its own (autocommit): gone with it
        assert executor.rows(("SHOW lock_timeout", [])) == [("7s",)]
        assert isinstance(sql, PostgreSQLSessions)
        executor.run(sql.name_session("sqlqueue test"))
        assert executor.rows(("SHOW application_name", [])) == [("sqlqueue test",)]
        assert isinstance(sql, PostgreSQLSessions)
        assert executor.rows(sql.horizon_privileges())[0][0] in (True, False)
        return
    assert isinstance(sql, MySQLSessions) and galera is not None and local is None
    assert int(executor.rows(("SELECT @@innodb_lock_wait_timeout", []))[0][0]) == 7
    try:
        executor.rows(galera)  # MariaDB: 0 off a cluster; MySQL: no such variable
    except Exception as error:
        assert "wsrep_on" in str(error)
    ((charset, max_packet),) = executor.rows(sql.connection_charset())
    assert charset == "utf8mb4" and int(max_packet) >= 1024
    assert int(executor.rows(sql.autoinc_lock_mode())[0][0]) in (0, 1, 2)


def _check_idle_transactions_bounded(executor: Executor, idle: Statement) -> None:
    """``bound_idle_transactions`` sets the session's bound (then put back: the test
    session must not be ended by a later test's pause)."""
    if connection.vendor == "postgresql":
        executor.run(idle)
        assert executor.rows(("SHOW idle_in_transaction_session_timeout", [])) == [("7s",)]
        executor.rows(("SELECT set_config('idle_in_transaction_session_timeout', '0', "
                       "false)", []))
        return
    ((version,),) = executor.rows(("SELECT VERSION()", []))
    if "mariadb" not in str(version).lower():
        return  # MySQL has no such variable: its executor never runs it
    executor.run(idle)
    assert int(executor.rows(("SELECT @@SESSION.idle_transaction_timeout", []))[0][0]) == 7
    executor.run(("SET SESSION idle_transaction_timeout = 0", []))


def test_system_check_statements(executor: Executor) -> None:
    sql = executor.sql
    if isinstance(sql, PostgreSQLSessions):
        encoding, isolation = executor.rows(sql.server_settings())[0]
        assert (encoding, isolation) == ("UTF8", "read committed")
    elif isinstance(sql, MySQLSessions):
        charset, max_packet = executor.rows(sql.server_settings())[0]
        assert charset == "utf8mb4" and int(max_packet) > 0
        levels = []
        for variable in ("transaction_isolation", "tx_isolation"):
            try:
                levels += executor.rows(sql.isolation_level(variable))
            except Exception as error:
                assert "isolation" in str(error)  # one of the two is unknown
        assert levels
        with pytest.raises(ValueError):
            sql.isolation_level("x; DROP TABLE y")
        collations = dict(executor.rows(sql.table_collations(["queue_messages", "nothing"])))
        assert list(collations) == ["queue_messages"]
        assert str(collations["queue_messages"]).endswith("_bin")
    else:
        pytest.skip("SQLite has no server to check")


def test_server_identity(executor: Executor) -> None:
    """Which server answers: what an atomic handler compares before its ack (guarantee I16)."""
    (identity,) = executor.rows(executor.sql.server_identity())[0]
    expected = {"sqlite": "", "mysql": " server_id ", "postgresql": " started "}
    assert expected[connection.vendor] in str(identity)
    assert executor.rows(executor.sql.server_identity()) == [(identity,)]  # stable


def test_server_record_and_voids(executor: Executor) -> None:
    """A failover's statements (sqlqueue.consuming.takeover): the record of which server
    granted the leases, moved only from the servers named; then every lease expires
    under a new generation and every delivery in flight without an error is visible."""
    sql = executor.sql
    executor.run(sql.ensure_server_record())
    executor.run(sql.ensure_server_record())  # again: nothing changes
    assert executor.rows(sql.read_server_record()) == [("",)]
    assert executor.run(sql.record_server("server one")) == 1
    assert executor.run(sql.record_server("server one")) == 0  # names it already
    assert executor.run(sql.record_server("server two", replacing=["other", ""])) == 0
    assert executor.run(sql.record_server("server two", replacing=["server one"])) == 1
    assert executor.rows(sql.read_server_record()) == [("server two",)]
    executor.run(sql.acquire_leases("g", "t", ["a"], "w", 30_000))
    in_flight, failed, acked = (send_message("t", {}, partition_key="k").offset
                                for _ in range(3))
    executor.run(sql.mark_delivered("g", "t", [("k", o, 10**15)
                                               for o in (in_flight, failed, acked)]))
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("k", failed, False, 10**15,
                                                            "boom"),
                                               OutcomeWrite("k", acked, True, 0)]))
    executor.run(sql.heartbeat("g", "t", "w"))
    assert executor.rows(sql.live_subscribers("g", "t", 30_000)) == [("w",)]
    assert executor.run(sql.void_leases()) == 1  # not the record
    assert executor.run(sql.void_heartbeats()) == 1
    assert executor.rows(sql.live_subscribers("g", "t", 30_000)) == []
    assert executor.run(sql.void_deliveries()) == 1
    ((_, owner, generation, age),) = executor.rows(sql.list_leases("g", "t"))
    assert (owner, int(generation)) == ("w", 2) and int(age) >= 30_000
    assert executor.rows(sql.read_server_record()) == [("server two",)]
    assert state(executor, in_flight)[1] == 0  # type: ignore[index]
    assert state(executor, failed)[1] == 10**15  # type: ignore[index]
    assert state(executor, acked)[:2] == (True, 0)  # type: ignore[index]


def test_a_missing_queue_table_is_recognised_on_this_database() -> None:
    """What ``send_message`` turns into ``NotMigrated`` (issue 37): this vendor's own
    error text for a table that does not exist."""
    from django.db import DatabaseError, transaction

    from sqlqueue.storage.sql.base import Store

    with pytest.raises(DatabaseError) as raised, transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM queue_not_migrated")
    assert Store.is_missing_queue_table(raised.value)
    with pytest.raises(DatabaseError) as other, transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM queue_messages")
    assert not Store.is_missing_queue_table(other.value)


# -- export and bulk publishing (storage.statements.export, .bulk) -----------------------
@dataclass(frozen=True)
class Column:
    name: str


@dataclass(frozen=True)
class ReadTable:
    """What the export statements read of a table (the Spark source's ``Table``)."""

    db_table: str = "queue_messages"
    order_by: tuple[str, ...] = ("offset",)
    topic_column: str = "topic"
    dead_letters_only: bool = False


LOG = ReadTable()
DEAD_LETTERS = ReadTable(topic_column="original_topic", dead_letters_only=True)
OFFSETS = ReadTable("queue_offsets", ("consumer_group", "topic", "partition_key"))


def columns(*names: str) -> list[Column]:
    return [Column(n) for n in names]


def bulk_row(key: str, mid: str) -> tuple[Any, ...]:
    """A row of ``store_new_messages``: key, id, payload text, metadata, published_at,
    priority, deliver_after."""
    return (key, mid, '{"n": 1}', None, 1000, 50, 0)


def test_export_reads(executor: Executor) -> None:
    sql = executor.sql
    first = send_message("t", {"n": 1}, partition_key="k").offset
    send_message("other", {"n": 2})
    last = send_message("t", {"n": 3}, partition_key="k").offset
    executor.run(sql.insert_dead_letters(dead_letter_topic="t.dlq", group="g1", letters=[
        DeadLetterWrite(first, "dl", 3, "boom", "{}")]))
    executor.run(("INSERT INTO queue_messages (topic, partition_key, id, payload, created_at, "
                  "published_at, consumer_group) VALUES ('t', 'k', 'replay', %s, 1, 1, 'g2')",
                  [b"{}"]))
    assert tuple(executor.rows(sql.log_bounds(LOG, "t"))[0]) == (first, last + 2)
    assert executor.rows(sql.log_bounds(LOG, None))[0][0] == first
    two = columns("offset", "topic")
    assert [r[0] for r in executor.rows(sql.rows_in_range(LOG, two, first, last))] == [
        first, first + 1]
    in_group = executor.rows(sql.rows_in_range(LOG, two, 0, 1 << 40, "t", "g1"))
    assert [r[0] for r in in_group] == [first, last]  # not g2's replay
    dead = executor.rows(sql.rows_in_range(DEAD_LETTERS, two, 0, 1 << 40, "t"))
    assert [r[1] for r in dead] == ["t.dlq"]
    executor.run(sql.ensure_watermarks("g", "t", ["b", "a"], 5))
    executor.run(sql.ensure_watermarks("g", "u", ["a"], 7))
    offsets = executor.rows(sql.table_rows(OFFSETS, columns("partition_key", "offset_acked"),
                                           "t"))
    assert [(r[0], int(r[1])) for r in offsets] == [("a", 5), ("b", 5)]
    ((created,),) = executor.rows((f"SELECT created_at FROM queue_messages "
                                   f"WHERE {sql.quote('offset')} = %s", [last]))
    assert executor.rows(sql.created_at_of(last)) == [(created,)]
    assert [int(r[0]) for r in executor.rows(sql.offsets_from(first, 2))] == [first,
                                                                               first + 1]


def test_partition_states_and_drop_open_states(executor: Executor) -> None:
    sql = executor.sql
    sent = [send_message("t", {}, partition_key="k").offset for _ in range(3)]
    executor.run(sql.mark_delivered("g", "t", [("k", o, 10**15) for o in sent]))
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite("k", sent[0], True, 0)]))
    states = executor.rows(sql.partition_states(columns("message_offset", "acked"), "g", "t",
                                                "k", sent[0] - 1, sent[1]))
    assert [(int(r[0]), bool(r[1])) for r in states] == [(sent[0], True), (sent[1], False)]
    assert executor.run(sql.drop_open_states("g", "t", sent[1])) == 1  # acked rows stay
    assert [state(executor, o) is not None for o in sent] == [True, False, True]


def test_store_new_messages_skips_stored_keys(executor: Executor) -> None:
    sql = executor.sql
    with executor.transaction():
        assert executor.run(sql.store_new_messages("t", [bulk_row("k", "a"),
                                                         bulk_row("k", "b")])) == 2
    with executor.transaction():
        inserted = executor.run(sql.store_new_messages("t", [bulk_row("k", "a"),
                                                             bulk_row("k", "c")]))
    # Django connects to MySQL with CLIENT.FOUND_ROWS: the skipped row counts as matched.
    found_rows = connection.vendor == "mysql" and isinstance(executor, DjangoExecutor)
    assert inserted == (2 if found_rows else 1)
    stored = executor.rows(("SELECT id, payload, created_at, published_at, priority "
                            "FROM queue_messages WHERE topic = 't' ORDER BY id", []))
    assert [r[0] for r in stored] == ["a", "b", "c"]
    assert bytes(stored[0][1]) == b'{"n": 1}'
    assert abs(int(stored[0][2]) - time.time() * 1000) < 60_000  # the database clock
    assert (int(stored[0][3]), int(stored[0][4])) == (1000, 50)


def test_load_messages_is_mysql_only(executor: Executor) -> None:
    """Run for real by tests/spark/test_statements.py (it needs a connection opened for
    bulk loads and the data source's in-memory file); here: its shape, and that only
    MySQL has it."""
    if connection.vendor != "mysql":
        with pytest.raises(NotImplementedError, match="no LOAD DATA"):
            executor.sql.load_messages("f", "t")
        return
    text, params = executor.sql.load_messages("f", "t")
    assert text.startswith("LOAD DATA LOCAL INFILE %s INTO TABLE `queue_messages`")
    assert params == ["f", "t"]


def test_postgresql_publishes_through_a_staging_table(executor: Executor) -> None:
    """COPY into a staging table of the transaction's own, then one INSERT that skips
    stored ids; the commit drops the table."""
    if connection.vendor != "postgresql":
        assert not hasattr(executor.sql, "create_staging")  # COPY is PostgreSQL's
        return
    sql = executor.sql
    assert isinstance(sql, PostgreSQLStatements)
    for ids, expected in ((["a", "b", "b"], 2), (["b", "c"], 1)):
        with executor.transaction():
            executor.run(sql.create_staging())
            executor.copy_rows(sql.copy_staging(), [
                ("k", mid, b'{"n": 1}', '{"m": 1}', 1000, 50, 0) for mid in ids])
            assert executor.run(sql.publish_staged("t")) == expected
    assert executor.rows(("SELECT to_regclass('pg_temp.sqlqueue_spark_staging')", [])) == [
        (None,)]
    assert executor.rows(("SELECT id FROM queue_messages ORDER BY id", [])) == [
        ("a",), ("b",), ("c",)]


def test_minute_stats(executor: Executor) -> None:
    sql = executor.sql
    now = int(executor.rows(sql.database_now_ms())[0][0])
    minute = now - now % 60_000
    executor.run(sql.add_minute_stats("g", "t", minute, {"ack": 2, "duration_03": 2,
                                                         "duration_sum": 0.08}))
    executor.run(sql.add_minute_stats("g", "t", minute, {"ack": 1, "fail": 1,
                                                         "duration_sum": 0.5}))  # adds
    executor.run(sql.add_minute_stats("g", "t", 60_000, {"published": 7}))  # long ago
    columns = ("published", "ack", "fail", "duration_03", "duration_sum")
    rows = executor.rows(sql.read_minute_stats(minute - 3_600_000, columns))
    assert [(r[0], r[1], int(r[2]), *map(int, r[3:7]), round(float(r[7]), 3))
            for r in rows] == [("g", "t", minute, 0, 3, 1, 2, 0.58)]
    assert len(executor.rows(sql.read_minute_stats(0, columns))) == 2
    # Summed per point of 5 minutes from `since` (9 minutes before `minute`): the minutes
    # 8 and 6 before `minute` in the first point, 3 and 1 before it in the second.
    since = minute - 9 * 60_000
    for ago, n in ((8, 10), (6, 20), (3, 40), (1, 80)):
        executor.run(sql.add_minute_stats("p", "t", minute - ago * 60_000, {"published": n}))
    points = executor.rows(sql.read_minute_points(since, 300_000, ("published", "ack")))
    assert [(r[0], r[1], int(r[2]), int(r[3]), int(r[4])) for r in points] == [
        ("g", "t", since + 300_000, 0, 3),  # the minute itself: its point's last
        ("p", "t", since, 10 + 20, 0), ("p", "t", since + 300_000, 40 + 80, 0)]
    executor.run(("DELETE FROM queue_minute_stats WHERE consumer_group = 'p'", []))
    assert executor.run(sql.delete_minute_stats(3_600_000)) == 1
    assert len(executor.rows(sql.read_minute_stats(0, columns))) == 1


def test_delivery_writes_keep_awkward_text(executor: Executor) -> None:
    """Keys and errors that an array literal must quote (PostgreSQL passes each column
    as one ``text_array``): commas, quotes, backslashes, braces, NULL,
    spaces, empty errors, newlines."""
    sql = executor.sql
    keys = ['a,"b\\c', "NULL", "x y", "{x}", "é ü"]
    sent = {key: send_message("t", {}, partition_key=key).offset for key in keys}
    executor.run(sql.mark_delivered("g", "t", [(k, o, 10**15) for k, o in sent.items()]))
    errors = {key: f'{key}\n"boom" \\ {{}}' for key in keys} | {"NULL": ""}
    executor.run(sql.write_outcomes("g", "t", [OutcomeWrite(k, o, False, 5, errors[k])
                                               for k, o in sent.items()]))
    executor.run(sql.restamp_visibility("g", "t", list(sent.items()), 60_000))
    for key, offset in sent.items():
        acked, invisible_until, retry_count, error = state(executor, offset)  # type: ignore[misc]
        assert (acked, retry_count, error) == (False, 0, errors[key])
        assert invisible_until > 10**12  # re-stamped from the database's now
