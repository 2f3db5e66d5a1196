"""send_message / send_messages against a real database (MariaDB or SQLite)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sqlqueue import InvalidMessage, OutgoingMessage, SentMessage, send_message, send_messages
from sqlqueue.models import QueueMessage
from sqlqueue.storage.sql import dialect_for
from tests.conftest import stored_messages
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def db_now_ms() -> int:
    with connection.cursor() as cursor:
        return dialect_for(connection).database_now_ms(cursor)


# -- I1: transactional publish -----------------------------------------------------------

def test_outside_a_transaction_the_message_commits_at_once() -> None:
    sent = send_message("orders.created", {"order_id": 1}, partition_key="c-1", id="o-1")
    assert sent == SentMessage("orders.created", "c-1", "o-1", sent.offset, created=True)
    (row,) = stored_messages()
    assert row["offset"] == sent.offset
    assert row["payload"] == {"order_id": 1}


def test_rollback_leaves_no_message() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="A")
        send_message("orders.created", {"order_id": 1})
        raise RuntimeError("the business transaction fails")
    assert stored_messages() == []
    assert not Order.objects.exists()


def test_savepoint_rollback_removes_only_the_inner_message() -> None:
    with transaction.atomic():
        outer = send_message("orders.created", {"n": "outer"})
        with pytest.raises(RuntimeError), transaction.atomic():
            send_message("orders.created", {"n": "inner"})
            raise RuntimeError
        after = send_message("orders.created", {"n": "after"})
    assert [m["payload"]["n"] for m in stored_messages()] == ["outer", "after"]
    assert outer.offset < after.offset


def test_on_commit_callbacks_are_unaffected() -> None:
    calls: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: calls.append("before"))
        send_message("t", 1)
        with pytest.raises(RuntimeError), transaction.atomic():
            send_message("t", 2)
            transaction.on_commit(lambda: calls.append("rolled back"))
            raise RuntimeError
        send_messages("t", [3, 4])
        transaction.on_commit(lambda: calls.append("after"))
        assert calls == []  # nothing runs before the commit
    assert calls == ["before", "after"]


def test_message_and_business_row_commit_together() -> None:
    with transaction.atomic():
        order = Order.objects.create(reference="B")
        send_message("orders.created", {"order_id": order.pk})
    assert stored_messages()[0]["payload"] == {"order_id": order.pk}


# -- I2: idempotent publish --------------------------------------------------------------

def test_same_id_twice_keeps_the_first_and_reports_it() -> None:
    first = send_message("t", {"v": 1}, partition_key="k", id="same")
    second = send_message("t", {"v": 2}, partition_key="k", id="same")
    assert second.created is False
    assert second.offset == first.offset
    assert [m["payload"] for m in stored_messages()] == [{"v": 1}]


def test_same_id_on_other_partition_or_topic_is_another_message() -> None:
    a = send_message("t", 1, partition_key="k1", id="x")
    b = send_message("t", 1, partition_key="k2", id="x")
    c = send_message("u", 1, partition_key="k1", id="x")
    assert a.created and b.created and c.created
    assert len({a.offset, b.offset, c.offset}) == 3


def test_dedup_inside_a_transaction_that_already_wrote() -> None:
    with transaction.atomic():
        first = send_message("t", 1, partition_key="k", id="i")
        again = send_message("t", 2, partition_key="k", id="i")
    assert (again.created, again.offset) == (False, first.offset)


def test_unkeyed_messages_with_the_same_id_deduplicate() -> None:
    first = send_message("t", 1, id="job-42")
    second = send_message("t", 1, id="job-42")
    assert first.partition_key == second.partition_key
    assert second.created is False


def test_unkeyed_messages_spread_over_default_partitions(settings: Any) -> None:
    settings.SQLQUEUE = {"DEFAULT_PARTITIONS": 4}
    sent = send_messages("t", list(range(200)))
    assert {s.partition_key for s in sent} == {f"default-{i}" for i in range(4)}


def test_send_messages_reports_duplicates_in_order() -> None:
    old = send_message("t", "old", partition_key="k", id="b")
    sent = send_messages("t", [
        OutgoingMessage("a", partition_key="k", id="a"),
        OutgoingMessage("b2", partition_key="k", id="b"),
        OutgoingMessage("a2", partition_key="k", id="a"),
        OutgoingMessage("c", partition_key="k", id="c"),
    ])
    assert [(s.id, s.created) for s in sent] == [
        ("a", True), ("b", False), ("a", False), ("c", True),
    ]
    assert sent[1].offset == old.offset
    assert sent[2].offset == sent[0].offset
    assert [m["payload"] for m in stored_messages()] == ["old", "a", "c"]


# -- validation: refused before any write, caller's transaction usable ---------------------

INVALID_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("", {}),
    ("t" * 252, {}),
    ("bad\ntopic", {}),
    ("t", {"partition_key": ""}),
    ("t", {"partition_key": "k" * 256}),
    ("t", {"partition_key": "a\x00b"}),
    ("t", {"id": ""}),
    ("t", {"id": "i" * 256}),
    ("t", {"id": "\x1b[31m"}),
    ("t", {"payload": object()}),
    ("t", {"payload": "x" * 1_048_577}),
    ("t", {"delay": -1}),
    ("t", {"delay": 1, "deliver_at": timezone.now()}),
    ("t", {"deliver_at": timezone.now().replace(tzinfo=None)}),
    ("t", {"priority": 256}),
    ("t", {"priority": -1}),
    ("t", {"metadata": {"n": 1}}),
    ("t", {"using": "nope"}),
]


@pytest.mark.parametrize(("topic", "kwargs"), INVALID_CALLS)
def test_invalid_input_is_refused_before_any_write(topic: str, kwargs: dict[str, Any]) -> None:
    kwargs = dict(kwargs)
    payload = kwargs.pop("payload", {"ok": True})
    with transaction.atomic():
        Order.objects.create(reference="kept")
        with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidMessage):
            send_message(topic, payload, **kwargs)
        assert len(queries) == 0
        # The caller's transaction is still usable and commits its own work.
        send_message("t", {"after": "error"})
    assert Order.objects.filter(reference="kept").exists()
    assert [m["payload"] for m in stored_messages()] == [{"after": "error"}]


def test_send_messages_is_all_or_nothing_on_invalid_input() -> None:
    batch: list[Any] = [OutgoingMessage(i) for i in range(5)]
    batch.insert(3, OutgoingMessage({"bad": 1}, priority=300))
    with CaptureQueriesContext(connection) as queries, pytest.raises(
        InvalidMessage, match="message 3: priority"
    ):
        send_messages("t", batch)
    assert len(queries) == 0
    assert stored_messages() == []


def test_send_messages_is_all_or_nothing_on_a_database_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dialect = dialect_for(connection)
    real_insert = dialect.insert_messages
    calls = {"n": 0}

    def fail_on_second_chunk(cursor: Any, rows: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OperationalError("connection lost in the middle of the batch")
        return real_insert(cursor, rows)

    monkeypatch.setattr(dialect, "insert_messages", fail_on_second_chunk)
    with pytest.raises(OperationalError):
        send_messages("t", list(range(1200)))  # three chunks of at most 500
    assert calls["n"] == 2
    assert stored_messages() == []


# -- stored columns ------------------------------------------------------------------------

def test_stored_columns() -> None:
    before = db_now_ms()
    sent = send_message("t", {"a": [1, 2]}, partition_key="k", id="i",
                        metadata={"trace": "abc"}, priority=7)
    after = db_now_ms()
    row = QueueMessage.objects.get(offset=sent.offset)
    assert before <= row.created_at <= after
    assert abs(row.published_at - row.created_at) < 60_000
    assert row.metadata == {"trace": "abc"}
    assert row.priority == 7
    assert row.deliver_after == 0
    assert (row.failed_at, row.failure_count, row.last_error, row.original_topic) == (0, 0, "", "")
    assert row.failure_detail is None and row.consumer_group == ""
    assert json.loads(bytes(row.payload)) == {"a": [1, 2]}


def test_empty_metadata_is_null() -> None:
    sent = send_message("t", 1, metadata={})
    assert QueueMessage.objects.get(offset=sent.offset).metadata is None


def test_delay_is_counted_from_the_database_clock() -> None:
    sent = send_message("t", 1, delay=timedelta(minutes=5))
    row = QueueMessage.objects.get(offset=sent.offset)
    assert row.deliver_after - row.created_at == 300_000


def test_deliver_at_is_stored_as_epoch_ms() -> None:
    at = timezone.now() + timedelta(hours=1)
    sent = send_message("t", 1, deliver_at=at)
    stored = QueueMessage.objects.get(offset=sent.offset).deliver_after
    assert stored == math.ceil(at.timestamp() * 1000)  # rounded up: never early


def test_send_messages_mixes_schedules_and_priorities() -> None:
    sent = send_messages("t", [
        OutgoingMessage(1, delay=10),
        OutgoingMessage(2, priority=0),
        OutgoingMessage(3, metadata={"k": "v"}),
    ])
    rows = {r.offset: r for r in QueueMessage.objects.all()}
    first, second, third = (rows[s.offset] for s in sent)
    assert first.deliver_after - first.created_at == 10_000
    assert (second.priority, second.deliver_after) == (0, 0)
    assert third.metadata == {"k": "v"}


def test_a_100_kib_payload_round_trips() -> None:
    payload = {"blob": "é" * 51_200}  # 100 KiB of UTF-8, past the RFC's 64 KiB BLOB
    sent = send_message("t", payload)
    row = QueueMessage.objects.get(offset=sent.offset)
    assert len(bytes(row.payload)) > 100 * 1024
    assert json.loads(bytes(row.payload)) == payload


def test_unicode_names_round_trip() -> None:
    send_message("заказы.🦆", "x", partition_key="клиент-7", id="идентификатор")
    (row,) = stored_messages()
    assert (row["topic"], row["partition_key"], row["id"]) == (
        "заказы.🦆", "клиент-7", "идентификатор",
    )


def test_names_compare_exactly() -> None:
    """Case and trailing spaces are significant (binary, no-pad collation)."""
    sent = [send_message("t", 1, partition_key="k", id=i) for i in ("a", "A", "a ")]
    assert all(s.created for s in sent)
    assert len(stored_messages()) == 3


def test_offsets_increase() -> None:
    offsets = [send_message("t", i).offset for i in range(5)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5
    batch = send_messages("t", list(range(600)))
    assert [s.offset for s in batch] == sorted(s.offset for s in batch)
    assert batch[0].offset > offsets[-1]


# -- query counts ----------------------------------------------------------------------------

def test_send_message_is_one_statement() -> None:
    with CaptureQueriesContext(connection) as outside:
        send_message("t", 1)
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        send_message("t", 2)
    assert len(outside) == 1
    assert len(inside) == 1
    assert inside[0]["sql"].upper().startswith("INSERT INTO")


def test_a_dedup_hit_costs_one_more_read() -> None:
    send_message("t", 1, partition_key="k", id="i")
    with CaptureQueriesContext(connection) as queries:
        send_message("t", 1, partition_key="k", id="i")
    assert len(queries) == 2


def test_send_messages_uses_multi_row_statements() -> None:
    with CaptureQueriesContext(connection) as queries:
        sent = send_messages("t", list(range(1000)))
    statements = [q["sql"].split()[0].upper() for q in queries]
    # Generated ids cannot exist yet, and the offsets of one multi-row INSERT are known
    # from the insert id: one INSERT per chunk and nothing else (MySQL: 1,000 rows per
    # statement, SQLite: 500), and no savepoint around a single statement.
    assert statements.count("INSERT") == chunks_of(1000)
    assert statements.count("SELECT") <= 1  # MySQL reads innodb_autoinc_lock_mode once
    if chunks_of(1000) == 1:
        assert set(statements) <= {"INSERT", "SELECT"}  # no transaction of its own
    assert_offsets_match(sent)


def test_send_messages_with_caller_ids_looks_them_up_first() -> None:
    batch = [OutgoingMessage(n, partition_key=f"k{n % 3}", id=f"id-{n}") for n in range(1000)]
    with CaptureQueriesContext(connection) as queries:
        sent = send_messages("t", batch)
    statements = [q["sql"].split()[0].upper() for q in queries]
    chunks = chunks_of(1000)
    assert statements.count("INSERT") == chunks
    assert chunks <= statements.count("SELECT") <= chunks + 1  # a lookup per chunk (+ lock mode)
    assert_offsets_match(sent)


def chunks_of(count: int) -> int:
    return -(-count // dialect_for(connection).max_rows_per_insert)


def assert_offsets_match(sent: list[SentMessage]) -> None:
    """Every reported offset is the stored row of that id."""
    stored = dict(QueueMessage.objects.values_list("offset", "id"))
    assert {s.offset: s.id for s in sent} == stored


def test_send_messages_of_nothing_runs_no_sql() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert send_messages("t", []) == []
    assert len(queries) == 0


def test_rfc_only_row_is_valid() -> None:
    """A row written by another RFC implementation (RFC columns only) gets our defaults."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_messages (topic, id, payload, metadata, partition_key, "
            "created_at, published_at, failed_at, failure_count, last_error, original_topic, "
            "failure_detail) VALUES ('t', 'rfc-1', '{}', NULL, 'k', 1, 1, 0, 0, '', '', NULL)"
        )
    row = QueueMessage.objects.get(id="rfc-1")
    assert (row.priority, row.deliver_after, row.consumer_group) == (50, 0, "")
