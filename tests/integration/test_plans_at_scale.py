"""The plans of the hot path's and garbage collection's statements on a log of a few
hundred thousand messages, read through Django's connection with the test settings (on
MySQL/MariaDB: Django's own connection collation, utf8mb4_general_ci, against the queue
tables' binary one). Each statement must use its index in order: on MariaDB/MySQL no
``Using filesort``, no full scan (type ``ALL``) and the expected index; on PostgreSQL no
Seq Scan of the big tables and no Sort above a scan where the index gives the order; on
SQLite no scan of the log and no temporary B-tree for an ORDER BY.

A small table's plan proves little: the optimizer reads a few pages whole, rightly, and
sorts a handful of rows for free. These plans are the ones a backlog of millions gets
(issue 52: garbage collection filesorted a whole partition per 1,000-row DELETE on
MariaDB, 2.5 s each at 2 million messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from sqlqueue import storage
from sqlqueue.storage.statements import Statement, Statements
from sqlqueue.storage.statements.tables import ALL_TABLES

pytestmark = pytest.mark.django_db

TOPIC = "backlog"
PARTITIONS = 64
#: messages of the backlog, spread over the partitions in turn (as publishing does)
MESSAGES = 300_000
#: messages of a second topic, interleaved with the backlog's offsets
OTHER_EVERY = 10
#: the first messages of the backlog that group "g" has delivery state for
STATES = 100_000
#: groups with a position (queue_offsets) and a lease on every partition of every topic
GROUPS = 20
#: topics the groups have positions on: the backlog's, and others
POSITION_TOPICS = (TOPIC, *(f"topic-{n}" for n in range(1, 10)))
GROUP = "g"
OWNER = "runner-1"
#: rows of the per-minute rollup: every group on every position topic, minute after minute
#: (a day of it is kept: 1,500 topics make two million rows)
MINUTE_ROWS = 100_000
FIRST_MINUTE = 1_700_000_000_000


# -- the log --------------------------------------------------------------------------
def _numbers(count: int) -> str:
    """A SELECT of the integers 0 .. count-1 as column ``i``, set-based on every vendor
    (PostgreSQL's generate_series; elsewhere a cross join of digits: MySQL caps a
    recursive CTE at 1,000 steps)."""
    if connection.vendor == "postgresql":
        return f"SELECT i FROM generate_series(0, {count - 1}) AS g(i)"
    digits = "SELECT 0 AS d UNION ALL " + " UNION ALL ".join(
        f"SELECT {d}" for d in range(1, 10))
    places = len(str(count - 1))
    joins = " CROSS JOIN ".join(f"({digits}) p{n}" for n in range(places))
    value = " + ".join(f"p{n}.d * {10 ** n}" for n in range(places))
    return f"SELECT {value} AS i FROM {joins} WHERE {value} < {count}"


def _text(expression: str) -> str:
    return (f"CAST({expression} AS CHAR)" if connection.vendor == "mysql"
            else f"CAST({expression} AS TEXT)")


def _concat(*parts: str) -> str:
    if connection.vendor == "sqlite":
        return " || ".join(parts)
    return f"CONCAT({', '.join(parts)})"


def _payload() -> str:
    """The same small JSON payload in every row, as the vendor's bytes."""
    text = "'{\"pad\": \"" + "x" * 80 + "\"}'"
    if connection.vendor == "postgresql":
        return f"convert_to({text}, 'UTF8')"
    return f"CAST({text} AS {'BINARY' if connection.vendor == 'mysql' else 'BLOB'})"


def _fill(cursor: Any) -> None:
    """The backlog, with every tenth offset another topic's; then what the consumer
    side keeps beside a log: the group's delivery state, positions and leases."""
    q = connection.ops.quote_name
    postgresql = connection.vendor == "postgresql"
    other = f"i % {OTHER_EVERY} = {OTHER_EVERY - 1}"
    topic = f"CASE WHEN {other} THEN 'other' ELSE '{TOPIC}' END"
    key = _concat("'k'", _text(f"i % {PARTITIONS}"))
    message_id = _concat("'m'", _text("i"))
    cursor.execute(
        "INSERT INTO queue_messages (topic, partition_key, id, payload, metadata, "
        "created_at, published_at, failed_at, failure_count, last_error, original_topic, "
        "priority, deliver_after, consumer_group) "
        f"SELECT {topic}, {key}, {message_id}, {_payload()}, NULL, 1700000000000, "
        f"1700000000000, 0, 0, '', '', 50, 0, '' FROM ({_numbers(MESSAGES)}) n ORDER BY i")
    true, false = ("TRUE", "FALSE") if postgresql else ("1", "0")
    cursor.execute(
        "INSERT INTO queue_delivery_state (consumer_group, topic, partition_key, "
        "message_offset, acked, invisible_until, retry_count, postponed, acked_at, "
        f"last_error) SELECT '{GROUP}', topic, partition_key, {q('offset')}, {true}, 0, 0, "
        f"{false}, 1700000000000, '' FROM queue_messages WHERE topic = '{TOPIC}' "
        f"ORDER BY {q('offset')} LIMIT {STATES}")
    keys = f"SELECT DISTINCT partition_key AS k FROM queue_messages WHERE topic = '{TOPIC}'"
    groups = " UNION ALL ".join(
        [f"SELECT '{GROUP}' AS g"] + [f"SELECT 'g{n}'" for n in range(1, GROUPS)])
    topics = " UNION ALL ".join(
        [f"SELECT '{POSITION_TOPICS[0]}' AS t"] + [f"SELECT '{t}'" for t in POSITION_TOPICS[1:]])
    cursor.execute(
        "INSERT INTO queue_offsets (consumer_group, topic, partition_key, offset_acked, "
        "updated_at, first_pending) SELECT gs.g, ts.t, ks.k, 1000, 0, NULL "
        f"FROM ({groups}) gs CROSS JOIN ({topics}) ts CROSS JOIN ({keys}) ks")
    cursor.execute(
        "INSERT INTO queue_partition_leases (consumer_group, topic, partition_key, "
        "leased_by, leased_at, lease_renewed_at, generation) SELECT consumer_group, topic, "
        f"partition_key, '{OWNER}', 0, 0, 1 FROM queue_offsets")
    cursor.execute(
        "INSERT INTO queue_subscriber_heartbeats (consumer_group, topic, subscriber_name, "
        f"heartbeat_at, deregistered_at) SELECT DISTINCT consumer_group, topic, '{OWNER}', "
        "0, 0 FROM queue_offsets")
    _fill_minute_stats(cursor)


def _fill_minute_stats(cursor: Any) -> None:
    """The rollup's rows: (group, topic) pairs in turn, a minute for every round of them."""
    pairs = GROUPS * len(POSITION_TOPICS)
    group = _concat("'g'", _text(f"i % {GROUPS}"))
    topic = _concat("'topic-'", _text(f"(i / {GROUPS}) % {len(POSITION_TOPICS)}"))
    if connection.vendor == "mysql":  # / is exact division there
        topic = _concat("'topic-'", _text(f"(i DIV {GROUPS}) % {len(POSITION_TOPICS)}"))
        minute = f"{FIRST_MINUTE} + (i DIV {pairs}) * 60000"
    else:
        minute = f"{FIRST_MINUTE} + (i / {pairs}) * 60000"
    cursor.execute(
        "INSERT INTO queue_minute_stats (consumer_group, topic, minute, published, "
        "dead_lettered, ack, acked, retry, fail, reject, duration_sum) "
        f"SELECT {group}, {topic}, {minute}, 1, 0, 1, 1, 0, 0, 0, 0.5 "
        f"FROM ({_numbers(MINUTE_ROWS)}) n")


def _analyze(cursor: Any) -> None:
    """Fresh statistics, as a table that has grown gets them (autovacuum, InnoDB's
    persistent statistics): the plans checked are the ones a real backlog gets."""
    for table in ALL_TABLES:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        elif connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {table}")
    if connection.vendor == "sqlite":
        cursor.execute("ANALYZE")


@pytest.fixture(scope="module")
def backlog(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The log, filled once for the module and committed (ANALYZE TABLE commits on
    MySQL anyway); each test reads plans inside its own transaction, rolled back; the
    rows go at the end, so that the tests after these find empty tables."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            _fill(cursor)
            _analyze(cursor)
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                _empty(cursor)


def _empty(cursor: Any) -> None:
    """The tables as the tests after these expect them: empty, and with the statistics
    of empty tables (a plan test elsewhere reads what the planner makes of a few rows;
    PostgreSQL, told of 300,000 rows, chose a bitmap scan there). TRUNCATE, as Django's
    flush between transactional tests does: MySQL recreates the table (its statistics
    gone), PostgreSQL resets the row count it plans with; SQLite forgets ANALYZE's."""
    tables = [connection.ops.quote_name(table) for table in ALL_TABLES]
    if connection.vendor == "postgresql":
        cursor.execute(f"TRUNCATE {', '.join(tables)}")
    elif connection.vendor == "mysql":
        for table in tables:
            cursor.execute(f"TRUNCATE TABLE {table}")
    else:
        for table in tables:
            cursor.execute(f"DELETE FROM {table}")
        cursor.execute("DROP TABLE IF EXISTS sqlite_stat1")
        cursor.execute("DROP TABLE IF EXISTS sqlite_stat4")


@pytest.fixture
def sql(backlog: None) -> Statements:
    return storage.store(connection).sql


# -- reading plans ---------------------------------------------------------------------
BIG_TABLES = ("queue_messages", "queue_delivery_state", "queue_minute_stats")


def mysql_plan(statement: Statement) -> list[dict[str, Any]]:
    """``EXPLAIN``'s rows, run as the store runs statements (``execute_rows``: values
    inlined), through Django's connection."""
    sql, params = statement
    with connection.cursor() as cursor:
        storage.store(connection).execute_rows(cursor, "EXPLAIN " + sql, params)
        columns = [c[0] for c in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def assert_mysql_in_order(statement: Statement, index: str | None,
                          table: str = "queue_messages", *, dedupes: bool = False,
                          sorts_range: bool = False) -> None:
    """No filesort, no temporary table (but where the statement ``dedupes`` the rows of
    a bounded range, or ``sorts_range``: groups and sorts the rows of a range of
    ``index``), no full scan; ``table`` read by ``index`` ("a or b": either; None:
    the plan reads ``table`` by no index at all, a MIN or MAX answered while planning:
    "Select tables optimized away")."""
    plan = mysql_plan(statement)
    for row in plan:
        extra = str(row.get("Extra") or "")
        # Grouping the rows of a capped derived table sorts at most the cap.
        grouped_cap = dedupes and str(row["table"]).startswith("<derived")
        assert sorts_range or grouped_cap or "Using filesort" not in extra, plan
        assert dedupes or sorts_range or "Using temporary" not in extra, plan
        assert not sorts_range or row["type"] == "range", plan
        assert row["type"] != "ALL" or str(row["table"]).startswith("<"), plan
    if index is None:
        assert any("optimized away" in str(row.get("Extra")) for row in plan), plan
        return
    # Rows of a UNION's or a derived table's result (<union1,2>, <derived2>) read what
    # the rows above them made, not a table.
    reads = [row for row in plan if row["table"] in (table, "m", "s", "capped")
             or str(row["table"]).startswith("<derived")]
    reads = [row for row in reads if not str(row["table"]).startswith("<")] or reads
    assert reads and all(row["key"] is not None for row in reads), plan
    assert any(row["key"] in index.split(" or ") for row in reads), plan


def postgresql_plan(statement: Statement) -> dict[str, Any]:
    sql, params = statement
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _log_reads_capped(node: dict[str, Any], under_limit: bool = False) -> bool:
    """Every read of the log below ``node`` is under a Limit (a capped range)."""
    under_limit = under_limit or node["Node Type"] == "Limit"
    if node.get("Relation Name") == "queue_messages" and not under_limit:
        return False
    return all(_log_reads_capped(child, under_limit) for child in node.get("Plans", []))


def assert_postgresql_in_order(statement: Statement, index: str | None, table: str, *,
                               dedupes: bool = False) -> None:
    """No Seq Scan of the log or the delivery state, no Sort above a scan of the log
    (the index gives the order; but where the statement ``dedupes`` the rows of
    capped ranges: a Sort of rows every read of the log under it got through a Limit),
    and ``index`` among the scans (when given;
    "a or b": either; PRIMARY: ``table``'s primary key)."""
    plan = postgresql_plan(statement)
    for node in _nodes(plan):
        if node["Node Type"] == "Seq Scan":
            assert node.get("Relation Name") not in BIG_TABLES, plan
        capped = _log_reads_capped(node)
        if node["Node Type"] in ("Sort", "Incremental Sort") and not (dedupes and capped):
            below = {n.get("Relation Name") for n in _nodes(node)}
            assert "queue_messages" not in below, plan
    if index is not None:
        wanted = {f"{table}_pkey" if name == "PRIMARY" else name
                  for name in index.split(" or ")}
        assert wanted & {n.get("Index Name") for n in _nodes(plan)}, plan


def assert_sqlite_in_order(statement: Statement, index: str | None, *,
                           dedupes: bool = False, sorts_range: bool = False) -> None:
    """No full scan of the log (``SCAN`` of it, with or without a covering index: a
    seek is ``SEARCH``) and no temporary B-tree (but for the DISTINCT or GROUP BY of a
    statement that ``dedupes`` a bounded range, or any of one that ``sorts_range``);
    ``index`` ("a or b": either) named."""
    sql, params = statement
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        details = [str(row[-1]) for row in cursor.fetchall()]
    for detail in details:
        assert "TEMP B-TREE" not in detail or sorts_range or (
            dedupes and detail in ("USE TEMP B-TREE FOR DISTINCT",
                                   "USE TEMP B-TREE FOR GROUP BY")), details
        assert not detail.startswith(("SCAN queue_messages", "SCAN m", "SCAN s",
                                      "SCAN queue_delivery_state",
                                      "SCAN queue_minute_stats")), details
    if index is not None:
        assert any(name in detail for name in index.split(" or ") for detail in details), \
            details


def assert_in_order(statement: Statement, index: str | None, *,
                    sqlite_index: str | None = "", table: str = "queue_messages",
                    dedupes: bool = False, sorts_range: bool = False) -> None:
    """The checks of the vendor under test. ``sqlite_index``: the index SQLite names
    ("" for the same as the others; SQLite calls the primary key of a rowid table no
    index and a unique constraint's index ``sqlite_autoindex_...``)."""
    if connection.vendor == "mysql":
        assert_mysql_in_order(statement, index, table, dedupes=dedupes,
                              sorts_range=sorts_range)
    elif connection.vendor == "postgresql":
        assert_postgresql_in_order(statement, index, table, dedupes=dedupes)
    else:
        assert_sqlite_in_order(statement, index if sqlite_index == "" else sqlite_index,
                               dedupes=dedupes, sorts_range=sorts_range)


def test_the_session_collation_is_not_the_tables(backlog: None) -> None:
    """What the plans below are read under on MySQL/MariaDB: Django's connection
    collation, not the binary one of the tables' columns (the case every plan here must
    hold in; with a matching session collation they would test nothing)."""
    if connection.vendor != "mysql":
        pytest.skip("collations of a MySQL/MariaDB session")
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@collation_connection")
        (session,) = cursor.fetchone()
        cursor.execute("SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE "
                       "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'queue_messages' "
                       "AND COLUMN_NAME = 'topic'")
        (column,) = cursor.fetchone()
    assert session.startswith("utf8mb4") and session != column


# -- garbage collection ---------------------------------------------------------------------
def test_gc_deletes_the_oldest_rows_of_a_partition_in_index_order(sql: Statements) -> None:
    """The statement of issue 52: on MariaDB it filesorted the whole partition for each
    1,000 rows it deleted."""
    assert_in_order(sql.delete_messages_upto(TOPIC, "k7", MESSAGES, 1000),
                    "idx_topic_partition_offset")


def test_a_deep_gc_sweeps_a_window_of_the_primary_key(sql: Statements) -> None:
    """``queue gc``'s statement: a range of the primary key, each partition to its
    limit; not the topic's range of an index (the whole topic)."""
    limits = [(f"k{n}", MESSAGES) for n in range(PARTITIONS)]
    assert_in_order(sql.delete_messages_in_window(TOPIC, 50_000, 60_000, limits), "PRIMARY",
                    sqlite_index="INTEGER PRIMARY KEY")


def test_gc_deletes_delivery_state_by_primary_key_ranges(sql: Statements) -> None:
    statement = sql.delete_states_upto(GROUP, TOPIC, [("k7", 50_000), ("k8", 50_000)])
    assert_in_order(statement, "PRIMARY", sqlite_index=None, table="queue_delivery_state")


# -- publishing -----------------------------------------------------------------------------
def test_publish_finds_stored_keys_by_the_unique_key(sql: Statements) -> None:
    statement = sql.select_message_offsets(TOPIC, [("k1", "m1"), ("k2", "m2")], lock=True)
    assert_in_order(statement, "idx_topic_partition_id", sqlite_index="sqlite_autoindex")


# -- fetching -----------------------------------------------------------------------------
def test_fetch_reads_a_partition_above_its_cursor_in_index_order(sql: Statements) -> None:
    assert_in_order(sql.fetch_messages(GROUP, TOPIC, "k7", 1000, 100),
                    "idx_topic_partition_offset")


def test_fetch_of_many_partitions_reads_each_in_index_order(sql: Statements) -> None:
    positions = [(f"k{n}", 1000) for n in range(16)]
    assert_in_order(sql.fetch_partitions(GROUP, TOPIC, positions, 100),
                    "idx_topic_partition_offset")


@pytest.mark.parametrize("topic", [TOPIC, "other"])
def test_a_fetch_from_the_start_reads_every_partition_by_its_offset_index(
        sql: Statements, topic: str) -> None:
    """Each partition read from offset 0 (a new group, or a partition's first fetch):
    the range covers all of its rows, and MariaDB, which reads the index dives, then
    priced ``idx_topic_partition_id`` (a ref on the same two columns) below it and sorted
    the whole partition for every fetch. Every member of the UNION must read the offset
    index, not merely one of them."""
    statement = sql.fetch_partitions(GROUP, topic, [(f"k{n}", 0) for n in range(16)], 10)
    assert_in_order(statement, "idx_topic_partition_offset")
    if connection.vendor == "mysql":
        reads = [row["key"] for row in mysql_plan(statement) if row["table"] == "m"]
        assert reads == ["idx_topic_partition_offset"] * 16, reads


def test_fetch_of_given_offsets_looks_them_up(sql: Statements) -> None:
    # By primary key, or by the offset index (the partition's prefix and the offsets).
    index = "PRIMARY" if connection.vendor == "mysql" else None
    assert_in_order(sql.fetch_messages_at(GROUP, TOPIC, "k7", [1031, 1095, 1159]), index)


def test_the_new_rows_of_a_poll_are_a_primary_key_range(sql: Statements) -> None:
    # DISTINCT over the rows published since the last poll (the caller keeps the range
    # short): MySQL de-duplicates them in a temporary table, bounded by the range.
    assert_in_order(sql.partitions_with_rows(TOPIC, MESSAGES - 500, MESSAGES), "PRIMARY",
                    sqlite_index=None, dedupes=True)


def test_a_sweep_reads_each_window_of_the_index(sql: Statements) -> None:
    windows = [(f"k{n}", 1000, 5000) for n in range(8)]
    assert_in_order(sql.partition_offsets(TOPIC, windows, 100), "idx_topic_partition_offset")


def test_discovery_and_heads_seek_once_per_partition(sql: Statements) -> None:
    # PostgreSQL's recursive seek of the next key may take either index that starts
    # with (topic, partition_key).
    either = ("idx_topic_partition_offset" if connection.vendor == "mysql"
              else "idx_topic_partition_offset or idx_topic_partition_id")
    assert_in_order(sql.discover_partitions(TOPIC), either)
    assert_in_order(sql.partition_heads(TOPIC), either)


def test_the_head_of_the_log_is_one_seek(sql: Statements) -> None:
    assert_in_order(sql.head_offset(), None if connection.vendor == "mysql" else "PRIMARY",
                    sqlite_index=None)


# -- marking, acking, giving back ------------------------------------------------------------
def test_state_changes_of_one_message_are_primary_key_lookups(sql: Statements) -> None:
    for statement in (sql.give_back(GROUP, TOPIC, [("k7", 1031)], None),
                      sql.give_back(GROUP, TOPIC, [("k7", 1031)], 2),
                      sql.extend_visibility(GROUP, TOPIC, "k7", 1031, 30_000),
                      sql.restamp_visibility(GROUP, TOPIC, [("k7", 1031), ("k8", 1032)],
                                             30_000)):
        assert_in_order(statement, "PRIMARY", sqlite_index=None, table="queue_delivery_state")


def test_acks_are_looked_up_by_primary_key(sql: Statements) -> None:
    statement = sql.acked_among(GROUP, TOPIC, [("k7", 1031), ("k8", 1032)])
    assert_in_order(statement, "PRIMARY", sqlite_index=None, table="queue_delivery_state")


# -- watermarks and lag -------------------------------------------------------------------------
def test_watermark_statements_use_the_position_keys(sql: Statements) -> None:
    partitions = [f"k{n}" for n in range(8)]
    moves = [(p, 2000, None) for p in partitions]
    # (topic, partition_key) ends with the primary key's group in InnoDB (extended
    # keys): a range of it is as narrow as the primary key's.
    either = "PRIMARY or idx_topic_partition"
    cases: list[tuple[Statement, str]] = [
        (sql.group_watermarks(GROUP, TOPIC), "PRIMARY"),
        (sql.group_watermarks(GROUP, TOPIC, partitions), either),
        (sql.advance_partition_watermarks(GROUP, TOPIC, moves), either),
        (sql.topic_watermarks(TOPIC), "idx_topic_partition"),
    ]
    for statement, index in cases:
        assert_in_order(statement, index, sqlite_index=None, table="queue_offsets")


def test_lag_probes_seek_the_offset_index(sql: Statements) -> None:
    pairs = [(f"k{n}", 1000 + n) for n in range(8)]
    assert_in_order(sql.first_offsets_above(TOPIC, pairs),
                    None if connection.vendor == "mysql" else "idx_topic_partition_offset")
    assert_in_order(sql.pending_summary(TOPIC, GROUP, pairs, 100),
                    "idx_topic_partition_offset")


def entries_read(statement: Statement) -> int | None:
    """Index entries and rows the statement read from the log, as the database counted
    them while running it (MySQL/MariaDB's ``ANALYZE FORMAT=JSON``, PostgreSQL's
    ``EXPLAIN (ANALYZE)``); None on SQLite, which does not count."""
    sql, params = statement
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            storage.store(connection).execute_rows(cursor, "ANALYZE FORMAT=JSON " + sql,
                                                   params)
            document = json.loads(cursor.fetchone()[0])
            return round(sum(float(t.get("r_loops") or 0) * float(t.get("r_rows") or 0)
                             for t in _json_tables(document) if t.get("table_name") == "m"))
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            document = cursor.fetchone()[0]
            plan = (json.loads(document) if isinstance(document, str) else document)[0]
            return sum(int(n["Actual Rows"]) * int(n["Actual Loops"])
                       for n in _nodes(plan["Plan"])
                       if n.get("Relation Name") == "queue_messages")
    return None


def _json_tables(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "table_name" in node:
            yield node
        for child in node.values():
            yield from _json_tables(child)
    elif isinstance(node, list):
        for child in node:
            yield from _json_tables(child)


def test_the_lag_of_many_partitions_reads_each_from_one_end(sql: Statements) -> None:
    """``pending_where_cheap``: each probe reads its partition by
    ``idx_topic_partition_offset`` from one end, at most ``cap`` entries (4,200 a
    partition here; read from the start, 16 probes read 67,000): MariaDB reads a
    correlated ``offset > watermark`` from the partition's start, so a probe below its
    watermark must stop at the newest ``cap`` entries and leave the partition to the
    caller. Group g1 has no delivery state."""
    cap = 100
    probes = [(TOPIC, "g1", f"k{n}", 0) for n in range(8)]  # wholly above: cap
    probes += [(TOPIC, "g1", f"k{n}", 1000) for n in range(8)]  # inside: left
    probes += [("other", "g1", "k9", 0), ("nothing", "g1", "k0", 0)]
    statement = sql.pending_where_cheap(probes, cap)
    assert_in_order(statement, "idx_topic_partition_offset")
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        counts = {int(r[0]): r[1] for r in cursor.fetchall()}
    assert [counts[n] for n in range(18)] == [cap] * 8 + [None] * 8 + [cap, 0], counts
    # A probe left to the caller reads its newest ``cap`` twice (its count and its due).
    read = entries_read(statement)
    assert read is None or read <= len(probes) * 2 * (cap + 2), read


def test_the_dead_letters_of_many_groups_stop_at_the_cap(sql: Statements) -> None:
    """``dead_letters_if_few``: a pair with ``cap`` or more rows (here: the backlog's,
    every row of it addressed to every group) reads ``cap`` entries of
    ``idx_group_topic_offset``, not its 270,000 rows."""
    cap = 100
    statement = sql.dead_letters_if_few([(TOPIC, ""), (f"{TOPIC}.dlq", GROUP)], cap)
    assert_in_order(statement, "idx_group_topic_offset", dedupes=True)
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        assert [(int(r[0]), r[1]) for r in cursor.fetchall()] == [(0, None)]
    read = entries_read(statement)
    assert read is None or read <= 3 * cap, read


# -- leases ------------------------------------------------------------------------------------
def test_lease_statements_use_the_lease_keys(sql: Statements) -> None:
    partitions = [f"k{n}" for n in range(8)]
    for statement in (sql.list_leases(GROUP, TOPIC, lock=True, partitions=partitions),
                      sql.renew_leases(GROUP, TOPIC, OWNER, dict.fromkeys(partitions, 1)),
                      sql.release_leases(GROUP, TOPIC, OWNER, partitions),
                      sql.live_subscribers(GROUP, TOPIC, 30_000)):
        table = ("queue_subscriber_heartbeats" if "heartbeat" in statement[0]
                 else "queue_partition_leases")
        assert_in_order(statement, "PRIMARY", sqlite_index=None, table=table)


def test_dead_letter_counts_read_the_topic_and_group_index(sql: Statements) -> None:
    # The lag's count of a group's dead letters: a capped range, not the topic's rows.
    assert_in_order(sql.dead_letter_counts(TOPIC, GROUP, 1000),
                    "idx_group_topic_offset", dedupes=True)


def test_the_first_messages_of_a_lag_probe_are_primary_key_lookups(sql: Statements) -> None:
    assert_in_order(sql.message_dues([1031, 1095, 1159]), "PRIMARY",
                    sqlite_index="INTEGER PRIMARY KEY")


def test_runs_in_flight_read_the_state_above_each_watermark(sql: Statements) -> None:
    windows = [(f"k{n}", 1000) for n in range(8)]
    assert_in_order(sql.runs_in_flight(GROUP, TOPIC, windows), "PRIMARY", sqlite_index=None,
                    table="queue_delivery_state")


# -- the admin's log pages (storage/statements/browse.py) -------------------------------------
def test_the_log_pages_list_topics_and_partitions_by_a_loose_index_scan(
        sql: Statements) -> None:
    # One seek per topic or partition (MySQL: "Using index for group-by"), never the
    # log's rows: the Messages page's topic filter at millions of messages.
    # SQLite sorts the recursive query's rows (one per topic or partition, not the log's)
    # for the ORDER BY in a temporary B-tree.
    either = "idx_topic_partition_offset or idx_topic_partition_id"
    sorts = connection.vendor == "sqlite"
    assert_in_order(sql.log_topics(100), either, sqlite_index=None, sorts_range=sorts)
    assert_in_order(sql.log_partitions(500), either, sqlite_index=None, sorts_range=sorts)


def test_a_search_by_key_or_id_looks_the_rows_up(sql: Statements) -> None:
    topics = [TOPIC, "other"]
    assert_in_order(sql.newest_of_key(topics, "k7", 20), "idx_topic_partition_offset")
    assert_in_order(sql.offsets_of_id([(TOPIC, ["k1", "k2"]), ("other", ["k9"])], "m100"),
                    "idx_topic_partition_id", sqlite_index="sqlite_autoindex")


def test_topic_counts_stop_at_the_cap(sql: Statements) -> None:
    either = "idx_topic_partition_offset or idx_topic_partition_id"
    assert_in_order(sql.topic_counts([TOPIC, "other"], 10_000), either, sqlite_index=None)


# -- the per-minute rollup (storage/statements/minute_stats.py) -------------------------------
#: the last minute of the rollup's rows, and the start of its last 20 minutes (of 500)
LAST_MINUTE = FIRST_MINUTE + (MINUTE_ROWS // (GROUPS * len(POSITION_TOPICS)) - 1) * 60_000
RECENT = LAST_MINUTE - 19 * 60_000


def test_the_live_overview_reads_a_range_of_minutes(sql: Statements) -> None:
    """The live overview's hour of a day kept (1,500 topics: two million rows): a
    range of ``idx_minute_stats_minute``, grouped and sorted (the range's rows only);
    not the whole day in primary-key order."""
    columns = ("published", "acked", "duration_sum")
    # SQLite may skip-scan the primary key instead: a range of minutes per (group,
    # topic), one seek each, as narrow.
    for statement in (sql.read_minute_stats(RECENT, columns),
                      sql.read_minute_points(RECENT, 5 * 60_000, columns)):
        assert_in_order(statement, "idx_minute_stats_minute", table="queue_minute_stats",
                        sorts_range=True, sqlite_index="idx_minute_stats_minute or "
                                                       "(ANY(consumer_group) AND ANY(topic)")


def test_the_rollup_forgets_old_minutes_by_a_range(sql: Statements) -> None:
    # "now", in database time, put where the oldest 20 minutes are older than the keep.
    sql_text, params = sql.delete_minute_stats(0)
    then = str(FIRST_MINUTE + 20 * 60_000)
    assert_in_order((sql_text.replace(sql.now_ms_sql, then), params),
                    "idx_minute_stats_minute", table="queue_minute_stats")
