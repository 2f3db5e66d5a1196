"""The data source's use of the shared statements (sqlqueue.storage.statements), on the
real database: what tests/integration/test_statement_layer.py cannot show through both
executors (a real LOAD DATA, the plans Spark's reads rely on, the write horizon seen by
another connection, the core's leases and heartbeats agreeing with Spark's).

These run through the data source's own Django-free connections; the tables were made by
Django's migrations.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from sqlqueue import send_message
from sqlqueue.integrations.spark.connect import Connection, Database
from sqlqueue.integrations.spark.infile import MemoryInfile
from sqlqueue.integrations.spark.tables import TABLES
from sqlqueue.integrations.spark.writer import _csv_bytes
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.storage.sql import store_for

MESSAGES = TABLES["messages"]


@pytest.fixture
def db(db_url: str) -> Iterator[Connection]:
    with Database.from_url(db_url).connect(bulk_load=True) as connection_:
        yield connection_


def row(pk: str, mid: str, payload: str = '{"n": 1}') -> tuple[Any, ...]:
    return (pk, mid, payload, None, 1000, 50, 0)


def test_database_now_ms(db: Connection) -> None:
    (now,) = db.one(db.sql.database_now_ms()) or (0,)
    assert abs(int(now) - time.time() * 1000) < 60_000


def test_load_messages_and_stored_keys(db: Connection, mysql_only: None) -> None:
    rows = [row("k", "a", '{"x": "a, \\"quoted\\"\\nvalue"}'), row("k", "b")]
    db.run(db.sql.store_new_messages("t", [row("k", "b")]))  # stored already
    infile = MemoryInfile(_csv_bytes(rows))
    infile.install(db.raw)
    with db.transaction():
        assert db.run(db.sql.load_messages(infile.name, "t")) == 1  # the duplicate skipped
    assert infile.served and not infile.refused
    assert bytes(QueueMessage.objects.get(id="a").payload).decode() == rows[0][2]
    found = db.rows(db.sql.select_message_offsets("t", [("k", "a"), ("k", "b"), ("k", "z")]))
    assert sorted(r[1:] for r in found) == [("k", "a"), ("k", "b")]


def test_select_message_offsets_on_sqlite(db: Connection) -> None:
    db.run(db.sql.store_new_messages("t", [row("k", "a")]))
    assert [r[1:] for r in db.rows(db.sql.select_message_offsets(
        "t", [("k", "a"), ("x", "a")]))] == [("k", "a")]


def test_write_horizon_sees_an_open_writing_transaction(db_url: str, db: Connection) -> None:
    statement = db.sql.write_horizon()
    if connection.vendor == "sqlite":
        assert statement is None  # one writer at a time: nothing commits out of order
        return
    assert statement is not None
    if connection.vendor == "postgresql":
        with Database.from_url(db_url).connect() as writer:
            writer.run((writer.sql.begin_sql, []))
            writer.run(writer.sql.store_new_messages("t", [row("k", "open")]))
            (started,) = writer.one(("SELECT FLOOR(EXTRACT(EPOCH FROM now()) * 1000)", []))
            with db.transaction(begin=db.sql.begin_snapshot_sql):
                seen = db.sql.parse_write_horizon(db.one(statement))
            writer.raw.rollback()
        # Exact: the oldest writer started no later than ours, and no margin.
        assert seen.oldest_writer_ms is not None and seen.oldest_writer_ms <= int(started)
        assert seen.margin_ms == 0
        return
    own = ("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
           "WHERE trx_mysql_thread_id = CONNECTION_ID()", [])
    # The server is shared: other transactions may be open; ours must show.
    # Before connecting: MariaDB stamps trx_started with the session's statement clock,
    # which a statement of the connection's set-up may have set (failed by 1.2 ms across
    # a second's boundary when read after it).
    opened = time.time() * 1000
    with Database.from_url(db_url).connect() as writer:
        writer.run((writer.sql.begin_sql, []))
        writer.run(writer.sql.store_new_messages("t", [row("k", "open")]))
        # INNODB_TRX is a snapshot, refreshed when nobody read it for 0.1 s. Read inside
        # a transaction of our own (begin_snapshot_sql), a fresh one lists that too.
        deadline = time.monotonic() + 10
        while True:
            with db.transaction(begin=db.sql.begin_snapshot_sql):
                oldest_writer, newest_start = db.one(statement) or (None, None)
                (listed,) = db.one(own) or (0,)  # at once: the same snapshot
            if oldest_writer is not None and listed:
                break
            assert time.monotonic() < deadline, "the open transaction never showed"
            time.sleep(0.15)
        writer.raw.rollback()
    # The oldest open writer started no later than ours (whole seconds); the snapshot
    # lists our own transaction, begun after it.
    assert int(oldest_writer) <= opened
    assert int(newest_start) >= int(oldest_writer)
    assert int(newest_start) >= opened - 1000


def test_partition_rows_and_partition_states(db: Connection) -> None:
    sent = [send_message("t", {"n": n}, partition_key=f"k{n % 2}").offset for n in range(6)]
    columns = [c.name for c in MESSAGES.columns[:3]]
    rows = db.rows(db.sql.partition_rows(columns, "t", "k0", sent[0], sent[4], 10))
    assert [r[0] for r in rows] == [sent[2], sent[4]]  # (after, upto] of k0 only
    assert len(db.rows(db.sql.partition_rows(columns, "t", "k0", 0, sent[4], 1))) == 1
    for offset in sent:
        DeliveryState.objects.create(consumer_group="g", topic="t", partition_key=f"k{offset % 2}",
                                     message_offset=offset, acked=True, acked_at=5)
    states_table = TABLES["delivery_state"]
    states = db.rows(db.sql.partition_states(states_table.columns, "g", "t", "k1", sent[1],
                                             sent[5]))
    assert [s[3] for s in states] == [o for o in sent if o % 2 and sent[1] < o <= sent[5]]


def test_discover_partitions_is_a_loose_index_scan(db: Connection) -> None:
    with db.transaction():
        for chunk in range(4):  # enough rows for the planner to prefer the loose scan
            db.run(db.sql.store_new_messages("t", [row(f"k{n % 10}", f"{chunk}-{n}")
                                                for n in range(500)]))
        db.run(db.sql.store_new_messages("u", [row("elsewhere", "x")]))
    if connection.vendor == "mysql":
        db.rows(("ANALYZE TABLE queue_messages", []))
    elif connection.vendor == "postgresql":
        db.run(("ANALYZE queue_messages", []))
    assert sorted(r[0] for r in db.rows(db.sql.discover_partitions("t"))) == [
        f"k{n}" for n in range(10)]
    sql, params = db.sql.discover_partitions("t")
    if connection.vendor == "mysql":
        plan = str(db.rows(("EXPLAIN " + sql, params)))
        assert "Using index for group-by" in plan, plan
    elif connection.vendor == "postgresql":
        plan = str(db.rows(("EXPLAIN " + sql, params)))
        # One seek per key, in whichever index leads with (topic, partition_key).
        assert "Index Only Scan" in plan and "Seq Scan" not in plan, plan
    else:
        plan = str(db.rows(("EXPLAIN QUERY PLAN " + sql, params)))
        assert "idx_topic_partition_offset" in plan, plan


def test_rows_in_range_reads_the_primary_key(db: Connection) -> None:
    sql, params = db.sql.rows_in_range(MESSAGES, MESSAGES.columns, 10, 20, "t")
    if connection.vendor == "mysql":
        plan = str(db.rows(("EXPLAIN " + sql, params)))
        assert "PRIMARY" in plan, plan
    elif connection.vendor == "postgresql":
        # A table of a few pages is read whole, rightly: give the planner a real one.
        with db.transaction():
            for chunk in range(6):
                db.run(db.sql.store_new_messages("t", [row(f"k{n % 10}", f"{chunk}-{n}")
                                                    for n in range(500)]))
        db.run(("ANALYZE queue_messages", []))
        plan = str(db.rows(("EXPLAIN " + sql, params)))
        assert "queue_messages_pkey" in plan and "Seq Scan" not in plan, plan
    else:
        plan = str(db.rows(("EXPLAIN QUERY PLAN " + sql, params)))
        assert "INTEGER PRIMARY KEY" in plan or "rowid" in plan.lower(), plan


def test_group_watermarks_ensure_and_advance(db: Connection) -> None:
    PartitionOffset.objects.create(consumer_group="g", topic="t", partition_key="a",
                                   offset_acked=9, updated_at=1, first_pending=12)
    db.run(db.sql.ensure_watermarks("g", "t", ["a", "b"], 4))
    PartitionOffset.objects.filter(partition_key="b").update(first_pending=5)
    assert sorted(db.rows(db.sql.group_watermarks("g", "t"))) == [("a", 9), ("b", 4)]
    assert db.run(db.sql.advance_watermarks("g", "t", 7)) == 1  # only b: a never goes back
    assert sorted(db.rows(db.sql.group_watermarks("g", "t"))) == [("a", 9), ("b", 7)]
    assert PartitionOffset.objects.get(partition_key="b").updated_at > 1
    # A runconsumer's hint of the first pending offset is unknown once Spark moved it.
    assert dict(PartitionOffset.objects.values_list("partition_key", "first_pending")) == {
        "a": 12, "b": None}


def test_heartbeats(db: Connection) -> None:
    db.run(db.sql.heartbeat("g", "t", "spark:g"))
    with connection.cursor() as cursor:
        store_for(connection).heartbeat(cursor, "g", "t", "worker")
    assert db.rows(db.sql.live_subscribers("g", "t", 30_000)) == [("spark:g",), ("worker",)]
    db.run(db.sql.deregister("g", "t", "worker"))
    assert db.rows(db.sql.live_subscribers("g", "t", 30_000)) == [("spark:g",)]


def test_leases_agree_with_runconsumer(db: Connection) -> None:
    core = store_for(connection)
    with connection.cursor() as cursor:
        core.acquire_leases(cursor, "g", "t", ["a"], "worker", 30_000)
    db.run(db.sql.acquire_leases("g", "t", ["a", "b"], "spark:g", 30_000))
    with db.transaction():
        leases = {r[0]: (r[1], r[2]) for r in db.rows(db.sql.list_leases("g", "t", lock=True))}
    assert leases == {"a": ("worker", 1), "b": ("spark:g", 1)}  # a live lease stays put
    # Renewing moves lease_renewed_at (five seconds old here) to now; a lease that is
    # not ours stays as it was.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = "
                       "lease_renewed_at - 5000")
    assert db.run(db.sql.renew_leases("g", "t", "spark:g", {"a": 1, "b": 1})) == 1
    ages = {r[0]: r[3] for r in db.rows(db.sql.list_leases("g", "t"))}
    assert ages["b"] < 5000 <= ages["a"]
    # An expired lease is taken over, with a new generation.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = 0 "
                       "WHERE partition_key = 'a'")
    db.run(db.sql.acquire_leases("g", "t", ["a"], "spark:g", 30_000))
    leases = {r[0]: (r[1], r[2]) for r in db.rows(db.sql.list_leases("g", "t"))}
    assert leases["a"] == ("spark:g", 2)
    with connection.cursor() as cursor:
        assert {p for p, *_ in core.list_leases(cursor, "g", "t")} == {"a", "b"}
    assert db.run(db.sql.release_leases("g", "t", "spark:g")) == 2


def test_identifiers_are_quoted(db: Connection) -> None:
    """`offset` is reserved in MariaDB >= 10.6: no statement may leave it bare."""
    sql = db.sql
    texts = [s[0] for s in (
        sql.log_bounds(MESSAGES, "t"), sql.rows_in_range(MESSAGES, MESSAGES.columns, 0, 1),
        sql.head_offset(), sql.created_at_of(1), sql.offsets_from(0, 1),
        sql.store_new_messages("t", [row("k", "a")]), sql.ensure_watermarks("g", "t", ["a"], 0),
    )]
    for text in texts:
        assert not re.search(r"(?<![`\"'])\boffset\b(?![`\"])", text), text


def test_list_pauses_reads_what_operators_paused(db: Connection) -> None:
    from sqlqueue.operations.flow import pause

    assert db.rows(db.sql.list_pauses()) == []
    pause("g", "t")
    pause(topic="all.of.it")
    assert sorted(tuple(r) for r in db.rows(db.sql.list_pauses())) == [("", "all.of.it"),
                                                                       ("g", "t")]
