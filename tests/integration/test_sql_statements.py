"""Every named statement in sqlqueue.storage.sql, on the real database, with its plan."""

from __future__ import annotations

import importlib
import json
import re
import time
from typing import Any

import pytest
from django.db import IntegrityError, connection

from sqlqueue.storage.sql import MessageRow, dialect_for

pytestmark = pytest.mark.django_db


def row(pk: str = "k", mid: str = "i", **overrides: Any) -> MessageRow:
    values: dict[str, Any] = {
        "topic": "t", "partition_key": pk, "id": mid, "payload": b'{"n":1}', "metadata": None,
        "published_at": 1, "priority": 50, "delay_ms": None, "deliver_at_ms": 0,
    }
    values.update(overrides)
    return MessageRow(**values)


def test_database_now_ms_is_the_server_clock_in_utc() -> None:
    with connection.cursor() as cursor:
        now = dialect_for(connection).database_now_ms(cursor)
    # This machine's clock and the local server's agree to well within a minute.
    assert abs(now - time.time() * 1000) < 60_000


def test_insert_messages_returns_the_offset_and_fails_on_duplicates() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        (offset,) = dialect.insert_messages(cursor, [row()]) or []
        assert offset > 0
        with pytest.raises(IntegrityError) as raised:
            dialect.insert_messages(cursor, [row(mid="new"), row()])
        assert dialect.is_duplicate_message(raised.value)
        # The failed multi-row statement left nothing behind, not even its first row.
        assert dialect.select_message_offsets(
            cursor, "t", [("k", "i"), ("k", "new")], lock=False
        ) == {("k", "i"): offset}


def test_insert_messages_computes_deliver_after() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        dialect.insert_messages(cursor, [
            row(mid="delayed", delay_ms=5000),
            row(mid="at", deliver_at_ms=1234),
            row(mid="now"),
        ])
        cursor.execute(
            "SELECT id, created_at, deliver_after FROM queue_messages ORDER BY id"
        )
        got = {mid: (created, after) for mid, created, after in cursor.fetchall()}
    assert got["delayed"][1] - got["delayed"][0] == 5000
    assert got["at"][1] == 1234
    assert got["now"][1] == 0


def test_insert_messages_reports_the_offsets_of_a_multi_row_insert() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        dialect.insert_messages(cursor, [row(mid="before")])
        offsets = dialect.insert_messages(cursor, [row(mid=f"m{n}") for n in range(50)])
        stored = dialect.select_message_offsets(
            cursor, "t", [("k", f"m{n}") for n in range(50)], lock=False
        )
    if offsets is None:  # MySQL with innodb_autoinc_lock_mode = 2: the caller reads back
        assert connection.vendor == "mysql"
        return
    assert offsets == [stored[("k", f"m{n}")] for n in range(50)]


def test_other_integrity_errors_are_not_duplicates() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor, pytest.raises(IntegrityError) as raised:
        cursor.execute(
            "INSERT INTO queue_messages (topic, partition_key, id, payload, created_at, "
            "published_at) VALUES ('t', 'k', 'i', NULL, 1, 1)"
        )
    assert not dialect.is_duplicate_message(raised.value)


def test_select_message_offsets_reads_only_the_asked_pairs() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        dialect.insert_messages(cursor, [row("a", "1"), row("a", "2"), row("b", "1")])
        found = dialect.select_message_offsets(
            cursor, "t", [("a", "1"), ("b", "1"), ("b", "2")], lock=True
        )
        assert set(found) == {("a", "1"), ("b", "1")}
        assert dialect.select_message_offsets(cursor, "t", [], lock=False) == {}


def explain(sql: str, params: list[Any]) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("EXPLAIN " + sql, params)
            columns = [c[0] for c in cursor.description]
            return " ".join(str(dict(zip(columns, r, strict=True))) for r in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return " ".join(str(r) for r in cursor.fetchall())


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_select_message_offsets_uses_the_unique_key() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        rows = [row(f"k{n % 7}", f"id-{n}") for n in range(300)]
        dialect.insert_messages(cursor, rows)
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
    sql = dialect.select_message_offsets_sql(3, lock=False)
    plan = explain(sql, ["t", "k1", "id-1", "t", "k2", "id-2", "t", "k3", "id-3"])
    if connection.vendor == "sqlite":
        # SQLite names the index of a UNIQUE constraint itself (sqlite_autoindex_...).
        assert "MULTI-INDEX OR" in plan
        assert plan.count("(topic=? AND partition_key=? AND id=?)") == 3
    else:
        assert "idx_topic_partition_id" in plan
        assert "'type': 'range'" in plan and "'key_len': '3066'" in plan


def test_identifiers_are_quoted() -> None:
    """`offset` is reserved in MariaDB >= 10.6: the statements must quote it."""
    dialect = dialect_for(connection)
    quoted = connection.ops.quote_name("offset")
    assert quoted in dialect.select_message_offsets_sql(1, lock=False)
    assert connection.ops.quote_name("queue_messages") in dialect.insert_messages_sql(1)


def test_tables_use_a_binary_no_pad_collation(mysql_only: None) -> None:
    initial = importlib.import_module("sqlqueue.migrations.0001_initial")
    expected = initial.binary_collation(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'queue\\_%%'"
        )
        collations = dict(cursor.fetchall())
    # The five RFC tables, and the Tasks backend's results (migration 0005).
    assert collations == dict.fromkeys((*initial.QUEUE_TABLES, "queue_task_results"), expected)


def test_offset_is_unsigned_auto_increment(mysql_only: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SHOW CREATE TABLE queue_messages")
        ddl = cursor.fetchone()[1]
    assert "`offset` bigint(20) unsigned NOT NULL AUTO_INCREMENT" in ddl or (
        "`offset` bigint unsigned NOT NULL AUTO_INCREMENT" in ddl
    )
    assert "UNIQUE KEY `idx_topic_partition_id` (`topic`,`partition_key`,`id`)" in ddl
    assert "KEY `idx_topic_partition_offset` (`topic`,`partition_key`,`offset`)" in ddl
    assert "longblob" in ddl


# ANALYZE TABLE commits on MySQL: tests that run it are transactional, so that the
# tables are emptied after them instead of keeping their rows.
@pytest.mark.django_db(transaction=True)
def test_partition_discovery_is_a_loose_index_scan() -> None:
    """Its cost grows with the number of partitions, not of messages."""
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        for chunk in range(4):
            dialect.insert_messages(cursor, [row(f"k{n % 10}", f"id-{chunk}-{n}")
                                             for n in range(500)])
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
        assert sorted(dialect.discover_partitions(cursor, "t")) == [f"k{n}" for n in range(10)]
    plan = explain(dialect.discover_partitions_sql(), dialect.discover_partitions_params("t"))
    if connection.vendor == "mysql":
        assert "Using index for group-by" in plan, plan
    else:
        assert "idx_topic_partition_offset (topic=? AND partition_key>?)" in plan, plan


def test_lease_statements_follow_the_database_clock() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        dialect.acquire_leases(cursor, "g", "t", ["a", "b"], "one", 30_000)
        dialect.acquire_leases(cursor, "g", "t", ["a", "b"], "two", 30_000)  # both live
        leases = {p: (owner, generation) for p, owner, generation, _ in
                  dialect.list_leases(cursor, "g", "t")}
        assert leases == {"a": ("one", 1), "b": ("one", 1)}
        # A lease not renewed for longer than the duration may be taken over; the
        # generation records the change of owner.
        cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = "
                       "lease_renewed_at - 60000 WHERE partition_key = 'a'")
        assert dialect.renew_leases(cursor, "g", "t", "one", 30_000) == 1  # b only
        dialect.acquire_leases(cursor, "g", "t", ["a"], "two", 30_000)
        leases = {p: (owner, generation) for p, owner, generation, _ in
                  dialect.list_leases(cursor, "g", "t")}
        assert leases == {"a": ("two", 2), "b": ("one", 1)}
        assert dialect.release_leases(cursor, "g", "t", ["a", "b"], "one") == 1
        dialect.heartbeat(cursor, "g", "t", "two")
        assert dialect.live_subscribers(cursor, "g", "t", 30_000) == ["two"]
        dialect.deregister(cursor, "g", "t", "two")
        assert dialect.live_subscribers(cursor, "g", "t", 30_000) == []


def _many_messages_in_ten_partitions() -> list[int]:
    """2,000 rows of topic t over k0..k9; returns their offsets."""
    dialect = dialect_for(connection)
    offsets: list[int] = []
    with connection.cursor() as cursor:
        for chunk in range(4):
            rows = [row(f"k{n % 10}", f"id-{chunk}-{n}") for n in range(500)]
            offsets += dialect.insert_messages(cursor, rows)
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
    return offsets


@pytest.mark.django_db(transaction=True)
def test_partition_heads_is_a_loose_index_scan() -> None:
    offsets = _many_messages_in_ten_partitions()
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        heads = dialect.partition_heads(cursor, "t")
    assert heads == {f"k{n}": max(offsets[n::10]) for n in range(10)}
    plan = explain(dialect.partition_heads_sql(), dialect.partition_heads_params("t"))
    if connection.vendor == "mysql":
        assert "Using index for group-by" in plan, plan
    else:
        assert "idx_topic_partition_offset (topic=? AND partition_key>?)" in plan, plan
        assert "idx_topic_partition_offset (topic=? AND partition_key=?)" in plan, plan


@pytest.mark.django_db(transaction=True)
def test_pending_summary_counts_up_to_a_cap_with_seeks() -> None:
    offsets = _many_messages_in_ten_partitions()
    dialect = dialect_for(connection)
    k0 = offsets[0::10]  # 200 offsets of k0
    watermarks = {"k0": k0[149], "k1": 0, "k2": max(offsets)}  # 50 / 200 / 0 above
    with connection.cursor() as cursor:
        summary = dialect.pending_summary(cursor, "t", "g", watermarks, cap=100)
        offset = connection.ops.quote_name("offset")
        cursor.execute(f"SELECT created_at FROM queue_messages WHERE {offset} = %s",
                       [k0[150]])
        first_pending_created = cursor.fetchone()[0]
    assert summary["k0"].count == 50
    assert summary["k0"].oldest_due_at == first_pending_created
    assert summary["k1"].count == 100  # capped
    assert summary["k2"].count == 0 and summary["k2"].oldest_due_at is None
    with connection.cursor() as cursor:
        uncounted = dialect.pending_summary(cursor, "t", "g", watermarks, cap=None)
    assert uncounted["k0"].count is None
    assert uncounted["k0"].oldest_due_at == first_pending_created
    plan = explain(dialect.pending_summary_sql(1), ["k0", "t", "k0", 0, 100, "t", "k0", 0, "g"])
    if connection.vendor == "mysql":
        # Never a scan of the table; the capped count is an index-only range.
        assert "'table': 'queue_messages', 'type': 'ALL'" not in plan, plan
        assert re.search(r"'select_type': 'DERIVED', 'table': 'queue_messages', "
                         r"'type': '(?:range|ref)', [^}]*'key': 'idx_topic_partition_offset', "
                         r"[^}]*'Extra': '[^']*Using index'", plan), plan
    else:
        assert "SCAN queue_messages" not in plan, plan
        assert "idx_topic_partition_offset (topic=? AND partition_key=? AND offset>?)" in plan


def test_pending_summary_splits_many_partitions_over_statements() -> None:
    dialect = dialect_for(connection)
    keys = {f"p{n:04}": 0 for n in range(450)}  # more than SQLite's compound-select limit
    with connection.cursor() as cursor:
        dialect.insert_messages(cursor, [row(key, "i") for key in keys])
        summary = dialect.pending_summary(cursor, "t", "g", keys, cap=10)
    assert {k: s.count for k, s in summary.items()} == dict.fromkeys(keys, 1)


def test_dead_letter_counts_per_partition() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        dialect.insert_messages(cursor, [row("a", "1", topic="t.dlq"),
                                         row("a", "2", topic="t.dlq"),
                                         row("b", "3", topic="t.dlq")])
        cursor.execute("UPDATE queue_messages SET consumer_group = 'g' WHERE topic = 't.dlq'")
        cursor.execute("UPDATE queue_messages SET consumer_group = 'other' WHERE id = '3'")
        assert dialect.dead_letter_counts(cursor, "t.dlq", "g", cap=10) == {"a": 2}
        assert dialect.dead_letter_counts(cursor, "t.dlq", "g", cap=1) == {"a": 1}


def test_pending_summary_skips_replays_addressed_to_other_groups() -> None:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        replay, mine = dialect.insert_messages(cursor, [row("k", "replay"), row("k", "mine")])
        cursor.execute("UPDATE queue_messages SET consumer_group = 'other', "
                       "created_at = 5 WHERE id = 'replay'")
        cursor.execute("UPDATE queue_messages SET created_at = 7 WHERE id = 'mine'")
        for_g = dialect.pending_summary(cursor, "t", "g", {"k": 0}, cap=10)["k"]
        for_other = dialect.pending_summary(cursor, "t", "other", {"k": 0}, cap=10)["k"]
        only_replay = dialect.pending_summary(cursor, "t", "g", {"k": replay - 1}, cap=10)
    assert (for_g.count, for_g.oldest_due_at) == (2, 7)  # counted, but not due for g
    assert for_other.oldest_due_at == 5
    assert only_replay["k"].oldest_due_at == 7
    assert mine > replay


AWKWARD_TEXT = "it's a \"quote\", a back\\slash, 100% _wild_ %s, é, 🦆, \u2028 and \x7e"


def test_insert_messages_stores_every_value_byte_for_byte() -> None:
    """MySQL inlines the values as escaped literals (mysql.py, insert_messages): quotes,
    backslashes, percent signs, non-ASCII text and every byte value must come back as
    they went in."""
    json_bytes = json.dumps({"text": AWKWARD_TEXT}, ensure_ascii=False).encode()
    binary = bytes(range(256))  # not JSON, but the column must keep any byte
    rows = [
        row(pk="key 'one' \\", mid=AWKWARD_TEXT, payload=json_bytes,
            metadata='{"k":"v \' \\\\ é"}', priority=255, published_at=2**53),
        row(pk="ключ", mid="fresh-0000", payload=binary, fresh_id=True),
        row(pk="k", mid="delayed", delay_ms=10**12),
    ]
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        offsets = dialect.insert_messages(cursor, rows)
        cursor.execute("SELECT partition_key, id, payload, metadata, priority, published_at, "
                       "deliver_after, created_at FROM queue_messages ORDER BY "
                       + connection.ops.quote_name("offset"))
        stored = cursor.fetchall()
    assert offsets is None or len(offsets) == 3
    assert [(r[0], r[1], bytes(r[2]), r[3], r[4], r[5]) for r in stored] == [
        (r.partition_key, r.id, r.payload, r.metadata, r.priority, r.published_at)
        for r in rows
    ]
    assert stored[2][6] - stored[2][7] == 10**12


def test_created_at_defaults_to_the_database_clock(mysql_only: None) -> None:
    """Migration 0006: MySQL's publishing INSERT leaves created_at to the column default."""
    dialect = dialect_for(connection)
    assert b"created_at" not in dialect.insert_messages_statement([row()])  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        before = dialect.database_now_ms(cursor)
        dialect.insert_messages(cursor, [row()])
        cursor.execute("SELECT created_at FROM queue_messages")
        (created_at,) = cursor.fetchone()
        after = dialect.database_now_ms(cursor)
    assert before <= created_at <= after
