"""Every named statement in sqlqueue.storage.sql, on the real database, with its plan."""

from __future__ import annotations

import importlib
import json
import re
import time
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections

from sqlqueue import send_message, storage
from sqlqueue.migrations._collation import binary_collation
from sqlqueue.models import DeliveryState, PartitionOffset
from sqlqueue.storage.sql import MessageRow, store_for

pytestmark = pytest.mark.django_db


def row(pk: str = "k", mid: str = "i", **overrides: Any) -> MessageRow:
    values: dict[str, Any] = {
        "topic": "t", "partition_key": pk, "id": mid, "payload": b'{"n":1}', "metadata": None,
        "published_at": 1, "priority": 50, "delay_ms": None, "deliver_at_ms": 0,
    }
    values.update(overrides)
    return MessageRow(**values)


def test_store_is_the_executor_of_a_connection(settings: Any) -> None:
    """``storage.store()``: SQLQUEUE["DATABASE"] by default, an alias, or a connection; one
    executor per connection, kept on it."""
    assert (storage.store() is storage.store("default") is storage.store(connection)
            is store_for(connection))
    settings.SQLQUEUE = {"DATABASE": "routes"}  # the same database under another alias
    assert storage.store() is storage.store("routes") is not storage.store("default")
    assert storage.store().connection is connections["routes"]


def test_database_now_ms_is_the_server_clock_in_utc() -> None:
    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
    # This machine's clock and the local server's agree to well within a minute.
    assert abs(now - time.time() * 1000) < 60_000


def test_insert_messages_returns_the_offset_and_fails_on_duplicates() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        (offset,) = store.insert_messages(cursor, [row()]) or []
        assert offset > 0
        with pytest.raises(IntegrityError) as raised:
            store.insert_messages(cursor, [row(mid="new"), row()])
        assert store.is_duplicate_message(raised.value)
        # The failed multi-row statement left nothing behind, not even its first row.
        assert store.select_message_offsets(
            cursor, "t", [("k", "i"), ("k", "new")], lock=False
        ) == {("k", "i"): offset}


@pytest.mark.parametrize("alone", [False, True], ids=["one statement", "one row each"])
def test_insert_messages_computes_deliver_after(alone: bool) -> None:
    """A delay counts from the clock reading that stamps ``created_at`` (one row alone
    is a statement of another shape on PostgreSQL)."""
    store = store_for(connection)
    rows = [row(mid="delayed", delay_ms=5000), row(mid="at", deliver_at_ms=1234),
            row(mid="now")]
    with connection.cursor() as cursor:
        for some in ([[r] for r in rows] if alone else [rows]):
            store.insert_messages(cursor, some)
        cursor.execute(
            "SELECT id, created_at, deliver_after FROM queue_messages ORDER BY id"
        )
        got = {mid: (created, after) for mid, created, after in cursor.fetchall()}
    assert got["delayed"][1] - got["delayed"][0] == 5000
    assert got["at"][1] == 1234
    assert got["now"][1] == 0


def test_insert_messages_reports_the_offsets_of_a_multi_row_insert() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.insert_messages(cursor, [row(mid="before")])
        offsets = store.insert_messages(cursor, [row(mid=f"m{n}") for n in range(50)])
        stored = store.select_message_offsets(
            cursor, "t", [("k", f"m{n}") for n in range(50)], lock=False
        )
    if offsets is None:  # MySQL with innodb_autoinc_lock_mode = 2: the caller reads back
        assert connection.vendor == "mysql"
        return
    assert offsets == [stored[("k", f"m{n}")] for n in range(50)]


def test_other_integrity_errors_are_not_duplicates() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor, pytest.raises(IntegrityError) as raised:
        cursor.execute(
            "INSERT INTO queue_messages (topic, partition_key, id, payload, created_at, "
            "published_at) VALUES ('t', 'k', 'i', NULL, 1, 1)"
        )
    assert not store.is_duplicate_message(raised.value)


def test_select_message_offsets_reads_only_the_asked_pairs() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.insert_messages(cursor, [row("a", "1"), row("a", "2"), row("b", "1")])
        found = store.select_message_offsets(
            cursor, "t", [("a", "1"), ("b", "1"), ("b", "2")], lock=True
        )
        assert set(found) == {("a", "1"), ("b", "1")}
        assert store.select_message_offsets(cursor, "t", [], lock=False) == {}


def explain(sql: str, params: list[Any]) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("EXPLAIN " + sql, params)
            columns = [c[0] for c in cursor.description]
            return " ".join(str(dict(zip(columns, r, strict=True))) for r in cursor.fetchall())
        if connection.vendor == "postgresql":
            # Run, not only planned: the row counts show each seek reads one entry.
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql,
                           params)
            return " | ".join(str(r[0]).strip() for r in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return " ".join(str(r) for r in cursor.fetchall())


def analyze() -> None:
    """Fresh statistics, so the plans checked are the ones a real table gets."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
        elif connection.vendor == "postgresql":
            cursor.execute("ANALYZE queue_messages")


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_select_message_offsets_uses_the_unique_key() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        rows = [row(f"k{n % 7}", f"id-{n}") for n in range(300)]
        store.insert_messages(cursor, rows)
        if connection.vendor == "postgresql":
            # PostgreSQL reads a table of a few pages whole, rightly: make it a real one.
            for chunk in range(6):
                store.insert_messages(cursor, [row(f"o{n % 20}", f"other-{chunk}-{n}")
                                                 for n in range(500)])
    analyze()
    keys = [("k1", "id-1"), ("k2", "id-2"), ("k3", "id-3")]
    plan = explain(*store.sql.select_message_offsets("t", keys))
    if connection.vendor == "sqlite":
        # SQLite names the index of a UNIQUE constraint itself (sqlite_autoindex_...).
        assert "MULTI-INDEX OR" in plan
        assert plan.count("(topic=? AND partition_key=? AND id=?)") == 3
    elif connection.vendor == "postgresql":
        # One lookup per key of the arrays, with a locking read too.
        for lock in (False, True):
            plan = explain(*store.sql.select_message_offsets("t", keys, lock=lock))
            assert "Seq Scan" not in plan and "Function Scan on k" in plan, plan
            assert re.search(r"Index Scan using idx_topic_partition_id [^|]*loops=3\)",
                             plan), plan
        # The plan does not grow with the keys (an OR of 1,000 terms, a bitmap scan
        # each, took 120-420 ms to plan).
        many = [(f"k{n % 7}", f"id-{n}") for n in range(1000)]
        plan = explain(*store.sql.select_message_offsets("t", many, lock=True))
        assert "BitmapOr" not in plan and plan.count("Scan") <= 3, plan
    else:
        assert "idx_topic_partition_id" in plan
        assert "'type': 'range'" in plan and "'key_len': '3066'" in plan


def test_identifiers_are_quoted() -> None:
    """`offset` is reserved in MariaDB >= 10.6: the statements must quote it."""
    store = store_for(connection)
    quoted = connection.ops.quote_name("offset")
    assert quoted in store.sql.select_message_offsets("", [("", "")], lock=False)[0]
    assert connection.ops.quote_name("queue_messages") in store.sql.store_messages([row()])[0]


def test_tables_use_a_binary_no_pad_collation(mysql_only: None) -> None:
    initial = importlib.import_module("sqlqueue.migrations.0001_initial")
    expected = binary_collation(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'queue\\_%%'"
        )
        collations = dict(cursor.fetchall())
    # The five RFC tables, the Tasks backend's results (migration 0005), the idempotency
    # keys (0007), the pauses (0008), the schedules (0009), the runner requests (0011),
    # the stored schedules (0012), the live overview's minute stats (0013) and the runs
    # of queue gc (0017).
    assert collations == dict.fromkeys(
        (*initial.QUEUE_TABLES, "queue_task_results", "queue_idempotency_keys",
         "queue_flow_control", "queue_schedules", "queue_runner_requests",
         "queue_stored_schedules", "queue_minute_stats", "queue_gc_runs"), expected)


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


def test_postgresql_schema_has_the_rfc_keys() -> None:
    """PostgreSQL's twin of the MySQL DDL check above: offset is a 64-bit identity
    primary key, the two indexes of the RFC exist, the payload keeps any byte."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's catalog")
    with connection.cursor() as cursor:
        cursor.execute("SELECT data_type, is_identity FROM information_schema.columns "
                       "WHERE table_name = 'queue_messages' AND column_name = %s", ["offset"])
        assert cursor.fetchone() == ("bigint", "YES")
        cursor.execute("SELECT data_type FROM information_schema.columns "
                       "WHERE table_name = 'queue_messages' AND column_name = 'payload'")
        assert cursor.fetchone() == ("bytea",)
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes "
                       "WHERE tablename = 'queue_messages'")
        indexes = dict(cursor.fetchall())
    assert "UNIQUE INDEX idx_topic_partition_id" in indexes["idx_topic_partition_id"]
    assert "(topic, partition_key, id)" in indexes["idx_topic_partition_id"]
    assert '(topic, partition_key, "offset")' in indexes["idx_topic_partition_offset"]


@pytest.mark.django_db(transaction=True)
def test_garbage_collection_deletes_by_seeks(server_database: None) -> None:
    """``delete_messages_upto`` reads the partition's oldest offsets from
    idx_topic_partition_offset and deletes them by primary key: never a table scan."""
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    upto = max(offsets)
    with connection.cursor() as cursor:
        deleted = store.delete_messages_upto(cursor, "t", "k3", upto, 50)
        assert deleted == 50
        left = store.list_offsets(cursor, "t", [("k3", 0, upto)], 1000)
    assert left == {"k3": sorted(offsets[3::10])[50:]}  # the 50 oldest of k3 went
    plan = explain_only(store.sql.delete_messages_upto("", "", 0, 0)[0], ["t", "k3", upto, 50])
    if connection.vendor == "postgresql":
        assert "Seq Scan" not in plan, plan
        assert "Index Only Scan using idx_topic_partition_offset" in plan, plan
        assert "Index Scan using queue_messages_pkey" in plan, plan
    else:
        assert "idx_topic_partition_offset" in plan, plan


def explain_only(sql: str, params: list[Any]) -> str:
    """The plan of a statement that changes rows, without running it."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return " | ".join(str(r) for r in cursor.fetchall())


# ANALYZE TABLE commits on MySQL: tests that run it are transactional, so that the
# tables are emptied after them instead of keeping their rows.
@pytest.mark.django_db(transaction=True)
def test_partition_discovery_is_a_loose_index_scan() -> None:
    """Its cost grows with the number of partitions, not of messages."""
    store = store_for(connection)
    with connection.cursor() as cursor:
        for chunk in range(4):
            store.insert_messages(cursor, [row(f"k{n % 10}", f"id-{chunk}-{n}")
                                             for n in range(500)])
    analyze()
    with connection.cursor() as cursor:
        assert sorted(store.discover_partitions(cursor, "t")) == [f"k{n}" for n in range(10)]
    plan = explain(*store.sql.discover_partitions("t"))
    if connection.vendor == "mysql":
        assert "Using index for group-by" in plan, plan
    elif connection.vendor == "postgresql":
        assert_recursive_seeks(plan)
    else:
        assert "idx_topic_partition_offset (topic=? AND partition_key>?)" in plan, plan


def assert_recursive_seeks(plan: str) -> None:
    """PostgreSQL's plan of the recursive loose index scan over ten partitions: one seek
    for the first key, then one per next key (ten loops, one row each), never a scan."""
    assert "Recursive Union" in plan and "Seq Scan" not in plan, plan
    # The seek may use either index that starts with (topic, partition_key).
    assert re.search(r"Index Only Scan using idx_topic_partition_\w+ [^|]*"
                     r"\(actual rows=1 loops=10\) \| Index Cond: [^|]*partition_key > ", plan), plan


def test_lease_statements_follow_the_database_clock() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.acquire_leases(cursor, "g", "t", ["a", "b"], "one", 30_000)
        store.acquire_leases(cursor, "g", "t", ["a", "b"], "two", 30_000)  # both live
        leases = {p: (owner, generation) for p, owner, generation, _ in
                  store.list_leases(cursor, "g", "t")}
        assert leases == {"a": ("one", 1), "b": ("one", 1)}
        # A lease not renewed for longer than the duration may be taken over; the
        # generation records the change of owner.
        cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = "
                       "lease_renewed_at - 60000 WHERE partition_key = 'a'")
        store.acquire_leases(cursor, "g", "t", ["a"], "two", 30_000)
        # The former holder's renewal at its generation finds it gone; b is extended.
        assert store.renew_leases(cursor, "g", "t", "one", {"a": 1, "b": 1}) == 1
        leases = {p: (owner, generation) for p, owner, generation, _ in
                  store.list_leases(cursor, "g", "t")}
        assert leases == {"a": ("two", 2), "b": ("one", 1)}
        assert store.release_leases(cursor, "g", "t", ["a", "b"], "one") == 1
        store.heartbeat(cursor, "g", "t", "two")
        assert store.live_subscribers(cursor, "g", "t", 30_000) == ["two"]
        store.deregister(cursor, "g", "t", "two")
        assert store.live_subscribers(cursor, "g", "t", 30_000) == []


def test_lease_statements_can_be_limited_to_some_partitions() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.acquire_leases(cursor, "g", "t", ["a", "b", "c"], "one", 30_000)
        assert {p for p, *_ in store.list_leases(cursor, "g", "t", partitions=["a", "c"])} \
            == {"a", "c"}
        assert store.renew_leases(cursor, "g", "t", "one", {"b": 1}) == 1
        assert store.renew_leases(cursor, "g", "t", "one", {}) == 0


@pytest.mark.django_db(transaction=True)
def test_a_fence_locks_only_its_own_lease_rows(server_database: None) -> None:
    # A peer paused inside its cycle transaction (its fence holds share locks on its own
    # lease rows) must not hold up another subscriber's renewal of its own leases.
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.acquire_leases(cursor, "g", "t", ["a"], "paused", 30_000)
        store.acquire_leases(cursor, "g", "t", ["b"], "busy", 30_000)
    default = connections["default"]
    peer = type(default)(dict(default.settings_dict), alias="paused_peer")
    try:
        with peer.cursor() as peer_cursor:
            peer_cursor.execute("START TRANSACTION")
            store.list_leases(peer_cursor, "g", "t", lock=True, partitions=["a"])
            with connection.cursor() as cursor:
                store.bound_lock_waits(cursor, 1)
                cursor.execute("SHOW lock_timeout" if connection.vendor == "postgresql"
                               else "SELECT @@SESSION.innodb_lock_wait_timeout")
                assert cursor.fetchone()[0] in (1, "1s")
                # No lock wait: one would end, after the bounded second, in the error
                # below instead of a renewed row (the peer's transaction stays open).
                assert store.renew_leases(cursor, "g", "t", "busy", {"b": 1}) == 1
                # Taking over the paused peer's partition waits, and gives up after the
                # bounded wait with an error the runner recognises.
                with pytest.raises(DatabaseError) as raised:
                    if connection.vendor == "postgresql":
                        # PostgreSQL's UPDATE skips a row its WHERE rejects without
                        # waiting for the row's lock: an upsert must take the row.
                        store.acquire_leases(cursor, "g", "t", ["a"], "busy", 30_000)
                    else:
                        store.renew_leases(cursor, "g", "t", "busy", {"a": 1})
                assert store.is_lock_wait(raised.value)
            peer_cursor.execute("ROLLBACK")
    finally:
        peer.close()


def _many_messages_in_ten_partitions() -> list[int]:
    """2,000 rows of topic t over k0..k9; returns their offsets."""
    store = store_for(connection)
    offsets: list[int] = []
    with connection.cursor() as cursor:
        for chunk in range(4):
            rows = [row(f"k{n % 10}", f"id-{chunk}-{n}") for n in range(500)]
            offsets += store.insert_messages(cursor, rows)
    analyze()
    return offsets


@pytest.mark.django_db(transaction=True)
def test_partition_heads_is_a_loose_index_scan() -> None:
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    with connection.cursor() as cursor:
        heads = store.partition_heads(cursor, "t")
    assert heads == {f"k{n}": max(offsets[n::10]) for n in range(10)}
    plan = explain(*store.sql.partition_heads("t"))
    if connection.vendor == "mysql":
        assert "Using index for group-by" in plan, plan
    elif connection.vendor == "postgresql":
        assert_recursive_seeks(plan)
        # Then one backward seek per key for its newest offset.
        assert re.search(r"Index Only Scan Backward using idx_topic_partition_offset [^|]*"
                         r"\(actual rows=1 loops=10\)", plan), plan
    else:
        assert "idx_topic_partition_offset (topic=? AND partition_key>?)" in plan, plan
        assert "idx_topic_partition_offset (topic=? AND partition_key=?)" in plan, plan


@pytest.mark.django_db(transaction=True)
def test_pending_summary_counts_up_to_a_cap_with_seeks() -> None:
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    k0 = offsets[0::10]  # 200 offsets of k0
    watermarks = {"k0": k0[149], "k1": 0, "k2": max(offsets)}  # 50 / 200 / 0 above
    with connection.cursor() as cursor:
        summary = store.pending_summary(cursor, "t", "g", watermarks, cap=100)
        offset = connection.ops.quote_name("offset")
        cursor.execute(f"SELECT created_at FROM queue_messages WHERE {offset} = %s",
                       [k0[150]])
        first_pending_created = cursor.fetchone()[0]
    assert summary["k0"].count == 50
    assert summary["k0"].oldest_due_at == first_pending_created
    assert summary["k1"].count == 100  # capped
    assert summary["k2"].count == 0 and summary["k2"].oldest_due_at is None
    with connection.cursor() as cursor:
        uncounted = store.pending_summary(cursor, "t", "g", watermarks, cap=None)
    assert uncounted["k0"].count is None
    assert uncounted["k0"].oldest_due_at == first_pending_created
    plan = explain(store.sql.pending_summary("", "", [("", 0)], 0)[0],
                   ["k0", "t", "k0", 0, 100, "t", "k0", 0, "g", "g"])
    if connection.vendor == "postgresql":
        assert "Seq Scan" not in plan and "Bitmap" not in plan, plan
        # The capped count: an index-only range that stops at the cap; the first due
        # message: the same range, one row.
        assert re.search(r"Index Only Scan using idx_topic_partition_offset [^|]*"
                         r"\(actual rows=100 loops=1\)", plan), plan
        assert re.search(r"Index Scan using idx_topic_partition_offset [^|]*"
                         r"\(actual rows=1 loops=1\)", plan), plan
    elif connection.vendor == "mysql":
        # Never a scan of the table; the capped count is an index-only range.
        assert "'table': 'queue_messages', 'type': 'ALL'" not in plan, plan
        assert re.search(r"'select_type': 'DERIVED', 'table': 'queue_messages', "
                         r"'type': '(?:range|ref)', [^}]*'key': 'idx_topic_partition_offset', "
                         r"[^}]*'Extra': '[^']*Using index'", plan), plan
    else:
        assert "SCAN queue_messages" not in plan, plan
        assert "idx_topic_partition_offset (topic=? AND partition_key=? AND offset>?)" in plan


def test_pending_summary_splits_many_partitions_over_statements() -> None:
    store = store_for(connection)
    keys = {f"p{n:04}": 0 for n in range(450)}  # more than SQLite's compound-select limit
    with connection.cursor() as cursor:
        store.insert_messages(cursor, [row(key, "i") for key in keys])
        summary = store.pending_summary(cursor, "t", "g", keys, cap=10)
    assert {k: s.count for k, s in summary.items()} == dict.fromkeys(keys, 1)


def test_dead_letter_counts_per_partition() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.insert_messages(cursor, [row("a", "1", topic="t.dlq"),
                                         row("a", "2", topic="t.dlq"),
                                         row("b", "3", topic="t.dlq")])
        cursor.execute("UPDATE queue_messages SET consumer_group = 'g' WHERE topic = 't.dlq'")
        cursor.execute("UPDATE queue_messages SET consumer_group = 'other' WHERE id = '3'")
        assert store.dead_letter_counts(cursor, "t.dlq", "g", cap=10) == {"a": 2}
        assert store.dead_letter_counts(cursor, "t.dlq", "g", cap=1) == {"a": 1}


def test_pending_summary_skips_replays_addressed_to_other_groups() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        replay, mine = store.insert_messages(cursor, [row("k", "replay"), row("k", "mine")])
        cursor.execute("UPDATE queue_messages SET consumer_group = 'other', "
                       "created_at = 5 WHERE id = 'replay'")
        cursor.execute("UPDATE queue_messages SET created_at = 7 WHERE id = 'mine'")
        for_g = store.pending_summary(cursor, "t", "g", {"k": 0}, cap=10)["k"]
        for_other = store.pending_summary(cursor, "t", "other", {"k": 0}, cap=10)["k"]
        only_replay = store.pending_summary(cursor, "t", "g", {"k": replay - 1}, cap=10)
    assert (for_g.count, for_g.oldest_due_at) == (2, 7)  # counted, but not due for g
    assert for_other.oldest_due_at == 5
    assert only_replay["k"].oldest_due_at == 7
    assert mine > replay


def test_pending_summary_skips_messages_the_group_acked_while_they_settle() -> None:
    """The write horizon can hold a watermark below messages the group already acked
    (``runconsumer --until-empty`` exits before they settle): they are not pending."""
    store = store_for(connection)
    with connection.cursor() as cursor:
        first, second = store.insert_messages(cursor, [row("k", "a"), row("k", "b")])
        cursor.execute("UPDATE queue_messages SET created_at = %s WHERE id = 'b'", [9])
        cursor.execute("INSERT INTO queue_delivery_state (consumer_group, topic, "
                       "partition_key, message_offset, acked) VALUES "
                       "('g', 't', 'k', %s, TRUE), ('other', 't', 'k', %s, TRUE)",
                       [first, second])
        for_g = store.pending_summary(cursor, "t", "g", {"k": 0}, cap=None)["k"]
        cursor.execute("UPDATE queue_delivery_state SET acked = TRUE")
        cursor.execute("INSERT INTO queue_delivery_state (consumer_group, topic, "
                       "partition_key, message_offset, acked) VALUES ('g', 't', 'k', %s, TRUE)",
                       [second])
        none_left = store.pending_summary(cursor, "t", "g", {"k": 0}, cap=10)["k"]
    assert for_g.oldest_due_at == 9  # the second; the acked first is skipped
    assert none_left.oldest_due_at is None
    assert none_left.count == 2  # stored above the watermark: the caller subtracts acked


@pytest.mark.django_db(transaction=True)
def test_first_offsets_above_is_one_index_dive_per_partition() -> None:
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    k0, k1 = offsets[0::10], offsets[1::10]
    pairs = [("k0", k0[149]), ("k1", 0), ("k2", max(offsets)), ("nowhere", 0), ("k0", 0)]
    with connection.cursor() as cursor:
        assert store.first_offsets_above(cursor, "t", pairs) == [
            k0[150], k1[0], None, None, k0[0]]
        many = [(f"k{n % 10}", 0) for n in range(450)]  # over several statements
        assert store.first_offsets_above(cursor, "t", many) == [
            offsets[n % 10] for n in range(450)]
    plan = explain(store.sql.first_offsets_above("", [("", 0)])[0], ["t", "k0", 0])
    if connection.vendor == "mysql":
        assert "Select tables optimized away" in plan, plan
    elif connection.vendor == "postgresql":
        # One index-only seek, one row read.
        assert re.search(r"Index Only Scan using idx_topic_partition_offset [^|]*"
                         r"\(actual rows=1 loops=1\)", plan), plan
    else:
        assert ("SEARCH queue_messages USING COVERING INDEX idx_topic_partition_offset "
                "(topic=? AND partition_key=? AND offset>?)") in plan, plan


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_fetch_partitions_reads_each_partition_by_its_own_range() -> None:
    """One statement for many partitions, each above its own offset and with its own
    limit; the same rows, with the group's state, as ``fetch_messages`` one by one."""
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    k0, k1 = offsets[0::10], offsets[1::10]
    DeliveryState.objects.create(consumer_group="g", topic="t", partition_key="k1",
                                 message_offset=k1[3], acked=True, acked_at=5)
    positions = [("k0", k0[196]), ("k1", k1[2]), ("k2", max(offsets)), ("nowhere", 0)]
    with connection.cursor() as cursor:
        found = store.fetch_partitions(cursor, "g", "t", positions, 2)
        assert {p: [r.offset for r in rows] for p, rows in found.items()} == {
            "k0": k0[197:199], "k1": k1[3:5], "k2": [], "nowhere": []}
        assert [r.acked for r in found["k1"]] == [True, None]
        assert found["k1"] == store.fetch_messages(cursor, "g", "t", "k1", k1[2], 2)
        many = [(f"k{n}", 0) for n in range(10)] + [(f"x{n}", 0) for n in range(100)]
        found = store.fetch_partitions(cursor, "g", "t", many, 1)  # two statements
        assert [found[f"k{n}"][0].offset for n in range(10)] == offsets[:10]
    plan = explain(store.sql.fetch_partitions("", "", [("", 0)] * 2, 0)[0],
                   ["g", 0, "t", "k0", 0, 5, "g", 0, "t", "k1", 0, 5])
    if connection.vendor == "mysql":
        assert plan.count("idx_topic_partition_offset") >= 2, plan
        assert "'type': 'ALL'" not in plan, plan
    elif connection.vendor == "postgresql":
        assert plan.count("Index Scan using idx_topic_partition_offset") == 2, plan
        assert "Seq Scan" not in plan, plan
    else:
        assert plan.count("USING INDEX idx_topic_partition_offset") == 2, plan


@pytest.mark.django_db(transaction=True)
def test_a_fetch_reads_the_state_above_the_cursor_only(postgresql_only: None) -> None:
    """The state table's statistics taken while it was empty (a new install, a burst
    after a quiet spell: autovacuum has not looked since) and 100 acked rows of the
    partition below the cursor since: a fetch of 100 rows must not read them for each
    row fetched. (PostgreSQL joined on the key's first three columns and filtered the
    offset: 100 ms a fetch in a 20,000-message drain, until the state's side of the join
    was bounded by the cursor too.)"""
    from sqlqueue.storage.sql.base import OutcomeWrite

    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    k0 = offsets[0::10]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_delivery_state")  # empty
        acked = [OutcomeWrite("k0", offset, acked=True, invisible_until=0)
                 for offset in k0[:100]]
        store.write_outcomes(cursor, "g", "t", acked)
        found = store.fetch_messages(cursor, "g", "t", "k0", k0[99], 50)
    assert [r.offset for r in found] == k0[100:150]
    plan = explain(*store.sql.fetch_messages("g", "t", "k0", k0[99], 50))
    # Whichever way it joins, the state's side reads from the cursor on: never the
    # partition's acked rows below it once for each row fetched.
    assert "Rows Removed by Join Filter" not in plan, plan
    assert re.search(r"queue_delivery_state s \(actual rows=0 loops=(1|50)\)", plan), plan


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_partitions_with_rows_reads_a_range_of_the_primary_key() -> None:
    """The partitions of a topic with a row in (after, upto]: the rows published since a
    poll, read by their offsets, never the topic's whole index."""
    offsets = _many_messages_in_ten_partitions()
    store = store_for(connection)
    with connection.cursor() as cursor:
        assert store.partitions_with_rows(cursor, "t", offsets[11], offsets[14]) == {
            "k2", "k3", "k4"}
        assert store.partitions_with_rows(cursor, "t", max(offsets), max(offsets) + 5) \
            == set()
        assert store.partitions_with_rows(cursor, "elsewhere", 0, max(offsets)) == set()
    plan = explain(store.sql.partitions_with_rows("", 0, 0)[0], [offsets[-20], offsets[-1], "t"])
    if connection.vendor == "mysql":
        assert "'key': 'PRIMARY'" in plan and "'type': 'range'" in plan, plan
    elif connection.vendor == "postgresql":
        assert re.search(r"Index Scan using queue_messages_pkey on queue_messages "
                         r"\(actual rows=19 loops=1\)", plan), plan
    else:
        # SQLite, which polls without asking (``narrows_fetches`` is PostgreSQL's), reads
        # the topic's entries of an index: a search, not a scan of the table.
        assert "SEARCH queue_messages USING" in plan and "SCAN" not in plan, plan


def test_mark_delivered_and_write_outcomes_store_every_value_as_given() -> None:
    """Values of many rows go in as given, whatever they hold (on MySQL they are inlined
    as literals: quotes, backslashes and percent signs must survive)."""
    from sqlqueue.storage.sql.base import OutcomeWrite

    store = store_for(connection)
    nasty = "it's a \\ \"quoted\" 100% %s ✓ 😀"
    with connection.cursor() as cursor:
        store.mark_delivered(cursor, "g'", "t", [(nasty, 1, 10), ("k", 2, 20)])
        store.write_outcomes(cursor, "g'", "t", [
            OutcomeWrite(nasty, 1, acked=False, invisible_until=99, last_error=nasty),
            OutcomeWrite("k", 2, acked=True, invisible_until=0),
        ])
    states = {s.message_offset: s for s in DeliveryState.objects.filter(consumer_group="g'")}
    assert (states[1].partition_key, states[1].last_error) == (nasty, nasty)
    assert (states[1].acked, states[1].invisible_until, states[1].retry_count) == (False, 99, 0)
    assert (states[2].acked, states[2].last_error) == (True, "")
    assert states[2].acked_at > 0


def test_acked_among_by_primary_key() -> None:
    store = store_for(connection)
    for key, offset, acked in (("a", 1, True), ("a", 2, False), ("b", 3, True), ("c", 4, True)):
        DeliveryState.objects.create(consumer_group="g", topic="t", partition_key=key,
                                     message_offset=offset, acked=acked)
    DeliveryState.objects.create(consumer_group="other", topic="t", partition_key="a",
                                 message_offset=2, acked=True)
    with connection.cursor() as cursor:
        assert store.acked_among(cursor, "g", "t", [("a", 1), ("a", 2), ("b", 3),
                                                       ("b", 1), ("x", 9)]) == {
            ("a", 1), ("b", 3)}
        assert store.acked_among(cursor, "g", "t", []) == set()
        many = [(f"k{n}", n) for n in range(1200)] + [("c", 4)]  # over several statements
        assert store.acked_among(cursor, "g", "t", many) == {("c", 4)}
    if connection.vendor == "postgresql":
        # A table of a few rows is read whole, rightly: ask whether the key can serve.
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
    plan = explain(*store.sql.acked_among("g", "t", [("a", 1), ("b", 3)]))
    if connection.vendor == "mysql":
        assert "'key': 'PRIMARY'" in plan, plan
    elif connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_seqscan")
        assert "queue_delivery_state_pkey" in plan, plan
    else:
        assert "PRIMARY KEY" in plan or "sqlite_autoindex_queue_delivery_state" in plan, plan


def test_advance_watermarks_records_the_first_pending_hint() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.ensure_watermark(cursor, "g", "t", "k")
        assert store.advance_watermarks(cursor, "g", "t", [("k", 5, 8)]) == 1
        assert store.advance_watermarks(cursor, "g", "t", [("k", 4, 6)]) == 0  # never back
    assert PartitionOffset.objects.values_list("offset_acked", "first_pending").get() == (5, 8)
    with connection.cursor() as cursor:
        store.advance_watermarks(cursor, "g", "t", [("k", 9, None)])
    assert PartitionOffset.objects.values_list("offset_acked", "first_pending").get() == (
        9, None)


def test_advance_watermarks_moves_each_partition_to_its_own_offset() -> None:
    """One statement for several partitions: each goes to its own offset with its own
    hint, one that would go back stays, and a partition not named is untouched."""
    store = store_for(connection)
    with connection.cursor() as cursor:
        for partition in ("a", "b", "c", "d"):
            store.ensure_watermark(cursor, "g", "t", partition)
        store.advance_watermarks(cursor, "g", "t", [("c", 30, None)])
        assert store.advance_watermarks(
            cursor, "g", "t", [("a", 10, 12), ("b", 20, None), ("c", 25, 26)]) == 2
    assert sorted(PartitionOffset.objects.values_list(
        "partition_key", "offset_acked", "first_pending")) == [
        ("a", 10, 12), ("b", 20, None), ("c", 30, None), ("d", 0, None)]


def test_a_sweep_reads_each_window_with_its_own_limit() -> None:
    """``list_offsets`` of several windows: each partition's offsets in (after, upto],
    in order, at most the limit each; a window with no rows is there, empty."""
    sent: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(6):
        for partition in sent:
            sent[partition].append(send_message("t", {}, partition_key=partition).offset)
    store = store_for(connection)
    with connection.cursor() as cursor:
        found = store.list_offsets(
            cursor, "t", [("a", sent["a"][0], sent["a"][4]), ("b", 0, sent["b"][5]),
                          ("c", 0, sent["b"][5])], 3)
    assert found == {"a": sent["a"][1:4], "b": sent["b"][:3], "c": []}


def test_delete_states_upto_drops_each_partition_s_own_range() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        for partition in ("a", "b", "c"):
            cursor.execute(*store.sql.mark_delivered(
                "g", "t", [(partition, offset, 0) for offset in (1, 2, 3)]))
        assert store.delete_states_upto(cursor, "g", "t", [("a", 1), ("b", 2)]) == 3
        cursor.execute("SELECT partition_key, message_offset FROM queue_delivery_state "
                       "ORDER BY partition_key, message_offset")
        assert list(cursor.fetchall()) == [("a", 2), ("a", 3), ("b", 3), ("c", 1), ("c", 2),
                                     ("c", 3)]


def test_message_dues_by_primary_key() -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        now, later = store.insert_messages(cursor, [
            row("k", "now"), row("k", "later", deliver_at_ms=4_000_000_000_000)])
        cursor.execute("UPDATE queue_messages SET created_at = 5, consumer_group = 'g' "
                       "WHERE id = 'now'")
        dues = store.message_dues(cursor, [now, later, 10**12])
    assert dues == {now: (5, "g"), later: (4_000_000_000_000, "")}
    if connection.vendor == "postgresql":
        # A table of a few pages is read whole, rightly: give the planner a real one.
        with connection.cursor() as cursor:
            for chunk in range(6):
                store.insert_messages(cursor, [row(f"o{n % 20}", f"other-{chunk}-{n}")
                                                 for n in range(500)])
        analyze()
    plan = explain(store.sql.message_dues([now, later])[0], [])
    if connection.vendor == "mysql":
        assert "'key': 'PRIMARY'" in plan, plan
    elif connection.vendor == "postgresql":
        assert "Index Scan using queue_messages_pkey" in plan, plan
    else:
        assert "PRIMARY KEY" in plan, plan


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
    store = store_for(connection)
    with connection.cursor() as cursor:
        offsets = store.insert_messages(cursor, rows)
        cursor.execute("SELECT partition_key, id, payload, metadata, priority, published_at, "
                       "deliver_after, created_at FROM queue_messages ORDER BY "
                       + connection.ops.quote_name("offset"))
        stored = cursor.fetchall()
    assert offsets is None or len(offsets) == 3

    def metadata(text: str | None) -> Any:
        # PostgreSQL keeps a JSONField as jsonb: the same map, its spacing normalised.
        if text is None or connection.vendor != "postgresql":
            return text
        return json.loads(text)

    assert [(r[0], r[1], bytes(r[2]), metadata(r[3]), r[4], r[5]) for r in stored] == [
        (r.partition_key, r.id, r.payload, metadata(r.metadata), r.priority, r.published_at)
        for r in rows
    ]
    assert stored[2][6] - stored[2][7] == 10**12


@pytest.fixture
def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("COPY: PostgreSQL's bulk path")


def copied_rows() -> list[MessageRow]:
    """Just enough rows for ``insert_messages`` to take PostgreSQL's COPY path."""
    from sqlqueue.storage.sql.postgresql import COPY_MIN_ROWS

    return [row(pk=f"k{n % 3}", mid=f"m{n}") for n in range(COPY_MIN_ROWS)]


def test_reserve_offsets_reads_the_clock_after_the_transaction_id(
    postgresql_only: None,
) -> None:
    store = store_for(connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id_if_assigned()")
        assert cursor.fetchone()[0] is None  # the test's transaction has written nothing
        before = store.database_now_ms(cursor)
        cursor.execute(store.sql.reserve_offsets(0)[0], ["queue_messages", "offset", 5])
        now_ms, offsets = cursor.fetchone()
        cursor.execute("SELECT pg_current_xact_id_if_assigned(), "
                       "FLOOR(EXTRACT(EPOCH FROM now()) * 1000)::bigint")
        xid, started = cursor.fetchone()
    assert xid is not None  # given its id by the statement, before its clock was read
    assert started <= before <= now_ms
    assert len(set(offsets)) == 5


def test_copy_messages_stores_every_value_with_offsets_in_order(
    postgresql_only: None,
) -> None:
    json_bytes = json.dumps({"text": AWKWARD_TEXT}, ensure_ascii=False).encode()
    rows = copied_rows()
    rows[0] = row(pk="key 'one' \\\t\n", mid=AWKWARD_TEXT, payload=json_bytes,
                  metadata='{"k":"v \' \\\\ \\t é"}', priority=255, published_at=2**53)
    rows[1] = row(pk="k", mid="binary", payload=bytes(range(256)), delay_ms=10**12)
    rows[2] = row(pk="k", mid="at", deliver_at_ms=1234)
    store = store_for(connection)
    with connection.cursor() as cursor:
        before = store.database_now_ms(cursor)
        offsets = store.insert_messages(cursor, rows)
        after = store.database_now_ms(cursor)
        cursor.execute('SELECT "offset", partition_key, id, payload, metadata, priority, '
                       'published_at, created_at, deliver_after FROM queue_messages')
        stored = {r[0]: r[1:] for r in cursor.fetchall()}
    assert offsets == sorted(offsets) and len(offsets) == len(rows)
    def jsonb(value: Any) -> Any:  # the raw cursor reads jsonb as text
        return json.loads(value) if isinstance(value, str) else value

    assert [(s[0], s[1], bytes(s[2]), jsonb(s[3]), s[4], s[5])
            for s in map(stored.get, offsets)] == [
        (r.partition_key, r.id, r.payload, r.metadata and json.loads(r.metadata), r.priority,
         r.published_at) for r in rows]
    created = {s[6] for s in stored.values()}  # one clock reading for the statement
    assert len(created) == 1 and before <= created.pop() <= after
    binary, at = stored[offsets[1]], stored[offsets[2]]
    assert (binary[7] - binary[6], at[7]) == (10**12, 1234)


def test_copy_messages_fails_whole_on_a_duplicate_and_leaves_the_transaction_usable(
    postgresql_only: None,
) -> None:
    store = store_for(connection)
    rows = copied_rows()
    with connection.cursor() as cursor:
        (first,) = store.insert_messages(cursor, [rows[7]]) or []
        with pytest.raises(IntegrityError) as raised:
            store.insert_messages(cursor, rows)
        assert store.is_duplicate_message(raised.value)
        cursor.execute("SELECT COUNT(*) FROM queue_messages")  # not an aborted transaction
        assert cursor.fetchone()[0] == 1
        offsets = store.insert_messages(cursor, [*rows[:7], *rows[8:], row(mid="more")]) or []
    assert len(offsets) == len(rows) and first not in offsets


def test_copy_messages_checks_the_other_constraints(postgresql_only: None) -> None:
    store = store_for(connection)
    rows = copied_rows()
    rows[5] = rows[5]._replace(priority=-1)  # the column's CHECK (validation forbids it)
    with connection.cursor() as cursor:
        with pytest.raises(IntegrityError) as raised:
            store.insert_messages(cursor, rows)
        assert not store.is_duplicate_message(raised.value)
        cursor.execute("SELECT COUNT(*) FROM queue_messages")
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_copy_messages_outside_a_transaction_commits_on_its_own(postgresql_only: None) -> None:
    store = store_for(connection)
    assert connection.get_autocommit()
    with connection.cursor() as cursor:
        offsets = store.insert_messages(cursor, copied_rows()) or []
        with pytest.raises(IntegrityError):
            store.insert_messages(cursor, copied_rows())
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute('SELECT "offset" FROM queue_messages ORDER BY "offset"')
            assert [r[0] for r in cursor.fetchall()] == offsets
    finally:
        other.close()


def test_created_at_defaults_to_the_database_clock(mysql_only: None) -> None:
    """Migration 0006: MySQL's publishing INSERT leaves created_at to the column default."""
    store = store_for(connection)
    assert "created_at" not in store.sql.store_messages([row()])[0]
    with connection.cursor() as cursor:
        before = store.database_now_ms(cursor)
        store.insert_messages(cursor, [row()])
        cursor.execute("SELECT created_at FROM queue_messages")
        (created_at,) = cursor.fetchone()
        after = store.database_now_ms(cursor)
    assert before <= created_at <= after


def test_statements_are_cut_by_their_escaped_size() -> None:
    from sqlqueue.publishing.inserts import message_chunks

    store = store_for(connection)
    quotes = row("k", "q")._replace(payload=b'"' + b"'" * 900_000 + b'"')
    rows = [quotes._replace(id=f"q{n}") for n in range(12)]
    limit = store.max_statement_bytes()
    for chunk in message_chunks(rows, store):
        assert sum(store.literal_bytes(r.payload, r.metadata) + 1024 for r in chunk) <= limit
    if connection.vendor == "mysql":  # inlined literals: each quote is sent escaped
        assert store.literal_bytes(quotes.payload, None) == 2 * len(quotes.payload)
    elif connection.vendor == "postgresql":  # bound on the client: bytea as hex
        assert store.literal_bytes(quotes.payload, None) == 2 * len(quotes.payload)
        assert store.literal_bytes(b"", "{'}") == 4
    else:  # parameters: sent as they are
        assert store.literal_bytes(quotes.payload, None) == len(quotes.payload)


def test_schedule_statements_create_claim_record_and_forget() -> None:
    from sqlqueue.storage.sql.schedules import PublishedTick

    store = store_for(connection)
    with connection.cursor() as cursor:
        store.ensure_schedules(cursor, [("a", 100, "every 60s"), ("b", 200, "every 1s")])
        store.ensure_schedules(cursor, [("a", 999, "changed")])  # an existing row stays
        rows = store.read_schedules(cursor)
        assert (rows["a"].checked_until, rows["a"].definition) == (100, "every 60s")
        assert rows["a"].last_tick is None and rows["a"].last_offset is None
        # The compare-and-set: only from the value read.
        assert store.claim_ticks(cursor, "a", 100, 160, "every 60s")
        assert not store.claim_ticks(cursor, "a", 100, 220, "every 60s")
        assert not store.claim_ticks(cursor, "missing", 0, 1, "")
        store.record_tick(cursor, "a", PublishedTick(160, "t", "k", 42, "schedule:a:x"))
        row = store.read_schedules(cursor, ["a"], lock=True)["a"]
        assert (row.checked_until, row.last_tick, row.last_topic, row.last_partition_key,
                row.last_offset, row.last_message_id) == (160, 160, "t", "k", 42,
                                                          "schedule:a:x")
        assert row.last_published_at is not None and row.last_published_at > 0
        assert store.read_schedules(cursor, []) == {}
        assert store.delete_schedule(cursor, "b") == 1
        assert store.delete_schedule(cursor, "b") == 0
        assert set(store.read_schedules(cursor)) == {"a"}


@pytest.mark.django_db(transaction=True)  # NOTIFY is delivered at commit
def test_wakeup_statements_notify_at_commit_and_listen() -> None:
    """``notify_wakeup`` (PostgreSQL: pg_notify, heard by a session that ran
    ``listen_wakeups``); elsewhere it sends nothing."""
    store = store_for(connection)
    if connection.vendor != "postgresql":
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured, connection.cursor() as cursor:
            store.notify_wakeup(cursor, "t")
        assert captured.captured_queries == []
        assert store.notifies_wakeups is False
        return
    import psycopg

    from sqlqueue.storage.sql.postgresql import STATEMENTS, WAKEUP_CHANNEL
    from sqlqueue.wakeups.postgresql import connection_params

    with psycopg.connect(**connection_params("default")) as listening:
        listening.execute(STATEMENTS.listen_wakeups()[0])
        with connections["default"].cursor() as cursor:
            store.notify_wakeup(cursor, "orders.created")  # autocommit: sent at once
        heard = [(n.channel, n.payload) for n in listening.notifies(timeout=10, stop_after=1)]
    assert heard == [(WAKEUP_CHANNEL, "orders.created")]


@pytest.mark.django_db(transaction=True)  # ANALYZE sees committed rows only
def test_seeks_read_one_entry_even_with_statistics_older_than_the_rows() -> None:
    """A topic written after the table was last analyzed (a new topic's first backlog,
    before autovacuum looks again): PostgreSQL's planner, expecting about one row, read
    every row of a range to take its MIN or MAX (200 per partition here, a million in a
    big backlog) instead of seeking the one it needs."""
    if connection.vendor != "postgresql":
        pytest.skip("the statistics of PostgreSQL's planner")
    store = store_for(connection)
    with connection.cursor() as cursor:
        store.insert_messages(cursor, [row("other", f"o{n}", topic="old") for n in range(50)])
        cursor.execute("ANALYZE queue_messages")  # topic t is not in the statistics
    offsets = []
    with connection.cursor() as cursor:
        for chunk in range(4):
            offsets += store.insert_messages(cursor, [row(f"k{n % 10}", f"id-{chunk}-{n}")
                                                        for n in range(500)])
    probe = explain(store.sql.first_offsets_above("", [("", 0)])[0], ["t", "k0", 0])
    heads = explain(*store.sql.partition_heads("t"))
    discovery = explain(*store.sql.discover_partitions("t"))
    for plan in (probe, heads, discovery):
        rows_read = [int(n) for n in re.findall(r"Index Only Scan[^|]*\(actual rows=(\d+)", plan)]
        assert rows_read and max(rows_read) == 1, plan
    with connection.cursor() as cursor:
        assert store.first_offsets_above(cursor, "t", [("k0", 0), ("k9", max(offsets))]) \
            == [offsets[0], None]
        assert store.partition_heads(cursor, "t") == {
            f"k{n}": max(offsets[n::10]) for n in range(10)}
        assert sorted(store.discover_partitions(cursor, "t")) == [f"k{n}" for n in range(10)]
