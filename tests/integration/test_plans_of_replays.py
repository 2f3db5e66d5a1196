"""The plans of the dead letters' set statements and of a bulk replay's steps (the
command's ``--all`` and the admin's confirmed "Replay all matching") on a log of a few
hundred thousand messages, a quarter of them dead letters, read through Django's
connection (on MySQL/MariaDB its collation, not the tables'): each seeks its index, none
reads the log or every dead letter, none sorts what the index orders (issue 56: the
admin's click read the 100,001 offsets it might replay, ordered, and MariaDB sorted
every match). The checks are those of test_plans_at_scale.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from sqlqueue import storage
from sqlqueue.models import DeadLetter
from sqlqueue.storage.statements import Statement, Statements
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite
from tests.integration.test_plans_at_scale import (
    _analyze,
    _concat,
    _empty,
    _numbers,
    _payload,
    _text,
    assert_in_order,
    mysql_plan,
    postgresql_plan,
)

pytestmark = pytest.mark.django_db

TOPIC, DLQ = "orders", "orders_dlq"
PARTITIONS = 16
#: messages of the log; every fourth one's dead letter follows it
MESSAGES = 120_000
DEAD_EVERY = 4
#: the dead letters' groups, in turn
GROUPS = ("g1", "g2")


def _fill(cursor: Any) -> None:
    """The messages, then the dead letters of every fourth (groups in turn), each as the
    consumer writes it (a detail with the message's id and offset)."""
    key = _concat("'k'", _text(f"i % {PARTITIONS}"))
    cursor.execute(
        "INSERT INTO queue_messages (topic, partition_key, id, payload, metadata, "
        "created_at, published_at, failed_at, failure_count, last_error, original_topic, "
        "priority, deliver_after, consumer_group) "
        f"SELECT '{TOPIC}', {key}, {_concat(chr(39) + 'm' + chr(39), _text('i'))}, "
        f"{_payload()}, NULL, 1700000000000, 1700000000000, 0, 0, '', '', 50, 0, '' "
        f"FROM ({_numbers(MESSAGES)}) n ORDER BY i")
    group = f"CASE WHEN i % {DEAD_EVERY * 2} = 0 THEN '{GROUPS[0]}' ELSE '{GROUPS[1]}' END"
    detail = _concat("'{\"id\": \"m'", _text("i"), "'\"}'")
    if connection.vendor == "postgresql":
        detail = f"CAST({detail} AS jsonb)"
    cursor.execute(
        "INSERT INTO queue_messages (topic, partition_key, id, payload, metadata, "
        "created_at, published_at, failed_at, failure_count, last_error, original_topic, "
        "priority, deliver_after, consumer_group, failure_detail) "
        f"SELECT '{DLQ}', {key}, {_concat(chr(39) + 'd' + chr(39), _text('i'))}, "
        f"{_payload()}, NULL, 1700000000000, 1700000000000, 1700000000000, 1, 'boom', "
        f"'{TOPIC}', 50, 0, {group}, {detail} "
        f"FROM ({_numbers(MESSAGES)}) n WHERE i % {DEAD_EVERY} = 0 ORDER BY i")


@pytest.fixture(scope="module")
def dead_letters(django_db_setup: None, django_db_blocker: Any) -> Iterator[list[int]]:
    """The log, filled once for the module and committed; a few dead letters' offsets
    (one step of a walk). The rows go at the end (the tests after expect empty tables)."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            _fill(cursor)
            _analyze(cursor)
        try:
            yield list(DeadLetter.objects.filter(topic=DLQ).order_by("offset")
                       .values_list("offset", flat=True)[1000:1100])
        finally:
            with connection.cursor() as cursor:
                _empty(cursor)


@pytest.fixture
def sql(dead_letters: list[int]) -> Statements:
    return storage.store(connection).sql


def assert_by_primary_key(statement: Statement, count: int,
                          index: str = "PRIMARY") -> None:
    """The log's rows looked up by ``index`` ("a or b": either), about ``count`` of them:
    no scan of the log (MySQL: type ALL; SQLite: SCAN), no filesort. MySQL materializes
    what an INSERT ... SELECT reads from its own table (Using temporary: those rows);
    PostgreSQL and SQLite may sort the rows a statement was given (an ``unnest``, a
    derived table), never the log."""
    if connection.vendor == "mysql":
        plan = mysql_plan(statement)
        reads = [row for row in plan if row["table"] in ("queue_messages", "m")]
        assert reads and all(row["key"] in index.split(" or ") for row in reads), repr(plan)
        assert all(row["type"] in ("range", "eq_ref", "const") for row in reads), repr(plan)
        assert all(int(row["rows"]) <= 2 * count for row in reads), repr(plan)
        # (a derived table of the given rows may be sorted: those rows)
        assert not any("filesort" in str(row.get("Extra")) for row in reads), repr(plan)
    elif connection.vendor == "postgresql":
        plan = postgresql_plan(statement)
        nodes = list(_nodes(plan))
        assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") ==
                       "queue_messages" for n in nodes), plan
        assert {n.get("Index Name") for n in nodes} & {"queue_messages_pkey"}, plan
    else:
        sql, params = statement
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            details = [str(row[-1]) for row in cursor.fetchall()]
        assert not any(d.startswith(("SCAN queue_messages", "SCAN m")) for d in details), \
            details
        names = [*index.replace("PRIMARY", "INTEGER PRIMARY KEY").split(" or ")]
        assert any(name in d for name in names for d in details), details


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_a_walk_step_reads_a_range_of_the_offset_index(sql: Statements,
                                                       dead_letters: list[int]) -> None:
    assert_in_order(sql.dead_letter_keys(DLQ, None, 5000), "idx_topic_partition_offset")
    # Far from the end of the topic (near it, fewer rows than the step remain, and
    # PostgreSQL rightly reads and sorts those few).
    assert_in_order(sql.dead_letter_keys(DLQ, ("k1", dead_letters[50]), 5000),
                    "idx_topic_partition_offset")


def test_replays_copy_and_delete_by_primary_key(sql: Statements,
                                                dead_letters: list[int]) -> None:
    assert_by_primary_key(sql.insert_replays(dead_letters), len(dead_letters))
    assert_in_order(sql.delete_dead_letters(dead_letters), "PRIMARY",
                    sqlite_index="INTEGER PRIMARY KEY")


def test_dead_letters_are_copied_by_primary_key(sql: Statements,
                                                dead_letters: list[int]) -> None:
    letters = [DeadLetterWrite(offset - 1, f"m{n}@g3", 3, "boom", '{"id": "m"}')
               for n, offset in enumerate(dead_letters)]
    assert_by_primary_key(sql.insert_dead_letters(dead_letter_topic=DLQ, group="g3",
                                                  letters=letters), len(letters))


def orm_statement(queryset: Any) -> Statement:
    sql, params = queryset.query.sql_with_params()
    return sql, list(params)


def test_the_clicks_steps_look_their_rows_up(dead_letters: list[int]) -> None:
    """A step of the admin's walk: the filters (here the group's, with the topics the
    changelist adds) applied to the step's offsets, then the matches locked; both by
    primary key, whatever the filters."""
    matching = DeadLetter._base_manager.filter(topic__in=[DLQ], consumer_group="g1")
    step = matching.filter(offset__in=dead_letters).order_by().values_list("offset")
    # MySQL may read the step's offsets from (consumer_group, topic, offset) instead:
    # the same points, from a narrower index.
    assert_by_primary_key(orm_statement(step), len(dead_letters),
                          "PRIMARY or idx_group_topic_offset")
    lock = (DeadLetter.objects.select_for_update().filter(offset__in=dead_letters)
            .order_by("offset").values_list("offset"))
    assert_by_primary_key(orm_statement(lock), len(dead_letters))
