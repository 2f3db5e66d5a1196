"""send_message / send_messages against a real database (MariaDB or SQLite)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sqlqueue import InvalidMessage, OutgoingMessage, SentMessage, send_message, send_messages
from sqlqueue.models import QueueMessage
from sqlqueue.storage.sql import store_for
from tests.conftest import stored_messages
from tests.manual_clock import ManualSeconds
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def db_now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


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
    store = store_for(connection)
    real_insert = store.insert_messages
    calls = {"n": 0}

    def fail_on_second_chunk(cursor: Any, rows: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OperationalError("connection lost in the middle of the batch")
        return real_insert(cursor, rows)

    monkeypatch.setattr(store, "insert_messages", fail_on_second_chunk)
    with pytest.raises(OperationalError):
        # three chunks (500 rows each at most; 5,000 on PostgreSQL, COPY)
        send_messages("t", list(range(2 * store.max_rows_per_insert + 200)))
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
    """Case and accents are significant (a binary collation, where a connection's
    ``utf8mb4_general_ci`` would take "a", "A" and "ä" for one id). A trailing space, which
    a PAD SPACE collation would ignore, is refused before it reaches the table (issue 53,
    W7: a look-alike of the name without it)."""
    sent = [send_message("t", 1, partition_key="k", id=i) for i in ("a", "A", "\u00e4")]
    assert all(s.created for s in sent)
    assert len(stored_messages()) == 3
    with pytest.raises(InvalidMessage, match="ends with whitespace"):
        send_message("t", 1, partition_key="k", id="a ")
    assert len(stored_messages()) == 3


def test_offsets_increase() -> None:
    offsets = [send_message("t", i).offset for i in range(5)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5
    batch = send_messages("t", list(range(600)))
    assert [s.offset for s in batch] == sorted(s.offset for s in batch)
    assert batch[0].offset > offsets[-1]


# -- query counts ----------------------------------------------------------------------------

def test_send_message_is_one_statement() -> None:
    """One INSERT, in autocommit or in the caller's transaction. On PostgreSQL it carries
    the wake-up's pg_notify (tests/integration/test_wakeups.py): not a statement of its
    own. The ids are sqlqueue's: no ON CONFLICT, even in a transaction."""
    send_message("t", 0)  # a MySQL connection's character set is read once, on first use
    with CaptureQueriesContext(connection) as outside:
        send_message("t", 1)
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        send_message("t", 2)
        send_message("t", 3)
    notifies = connection.vendor == "postgresql"
    assert len(outside) == 1
    assert len(inside) == 2
    statements = [q["sql"] for q in [*outside, *inside]]
    assert all(sql.upper().startswith("INSERT INTO") for sql in statements)
    assert ["pg_notify" in sql for sql in statements] == [notifies] * 3
    assert not any("ON CONFLICT" in sql for sql in statements)


def test_a_dedup_hit_costs_one_more_read() -> None:
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 0}):
        send_message("t", 1, partition_key="k", id="i")
        with CaptureQueriesContext(connection) as queries:
            send_message("t", 1, partition_key="k", id="i")
    assert len(queries) == 2  # the INSERT that fails, the read of the stored offset


def test_an_id_of_the_callers_costs_a_key_read_and_a_key_write() -> None:
    """IDEMPOTENCY_WINDOW: the key is read first (a hit costs that read alone) and
    written with the message, in one transaction."""
    send_message("t", 0)  # the connection's character set is read once, on first use
    with CaptureQueriesContext(connection) as first:
        sent = send_message("t", 1, partition_key="k", id="i")
    with CaptureQueriesContext(connection) as again:
        assert send_message("t", 1, partition_key="k", id="i").offset == sent.offset
    assert _statements(first) == [
        ("SELECT", "queue_idempotency_keys"), ("INSERT", "queue_messages"),
        ("INSERT", "queue_idempotency_keys")]
    assert _statements(again) == [("SELECT", "queue_idempotency_keys")]


def _statements(queries: CaptureQueriesContext) -> list[tuple[str, str]]:
    """(verb, first queue table) of each statement; SQLite's BEGIN/COMMIT left out."""
    found = []
    for query in queries:
        if query["sql"].startswith("SELECT pg_notify"):
            continue  # the wake-up (PostgreSQL), counted by tests/integration/test_wakeups.py
        words = query["sql"].replace("`", " ").replace('"', " ").split()
        if words[0].upper() not in ("BEGIN", "COMMIT"):
            found.append((words[0].upper(), next(w for w in words if w.startswith("queue_"))))
    return found


def test_send_messages_uses_multi_row_statements() -> None:
    with CaptureQueriesContext(connection) as queries:
        sent = send_messages("t", list(range(1000)))
    statements = [q["sql"].split()[0].upper() for q in queries]
    if connection.vendor == "postgresql":
        # One COPY (5,000 rows a chunk), after the SELECT of its clock and offsets, in a
        # transaction of its own (a savepoint inside the caller's): COPY cannot skip a
        # duplicate, only fail. Then the wake-up's NOTIFY (a SELECT pg_notify).
        assert statements == ["BEGIN", "SELECT", "COPY", "COMMIT", "SELECT"]
        assert "pg_notify" in queries.captured_queries[-1]["sql"]
        assert_offsets_match(sent)
        return
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
    copies = statements.count("COPY")  # PostgreSQL: each after a SELECT of its offsets
    # Per chunk: the idempotency keys and the stored ids are looked up, the messages and
    # their keys inserted (+ innodb_autoinc_lock_mode, read once).
    assert statements.count("INSERT") + copies == 2 * chunks
    assert copies == (chunks if connection.vendor == "postgresql" else 0)
    assert 2 * chunks + copies <= statements.count("SELECT") <= 2 * chunks + 1 + copies
    assert_offsets_match(sent)


def chunks_of(count: int) -> int:
    return -(-count // store_for(connection).max_rows_per_insert)


def assert_offsets_match(sent: list[SentMessage]) -> None:
    """Every reported offset is the stored row of that id."""
    stored = dict(QueueMessage.objects.values_list("offset", "id"))
    assert {s.offset: s.id for s in sent} == stored


@pytest.mark.parametrize("window", [86400, 0])
def test_a_large_batch_partly_published_before_absorbs_the_stored_ids(window: int) -> None:
    """Large enough for PostgreSQL's COPY path: the ids stored before are found (by the
    idempotency keys, or by the messages without a window) and reported with their
    offsets; the rest is stored, in order, inside the caller's transaction."""
    batch = [OutgoingMessage(n, partition_key=f"k{n % 4}", id=f"id-{n}") for n in range(300)]
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": window}), transaction.atomic():
        before = send_messages("t", batch[100:200])
        sent = send_messages("t", batch)
    assert [s.created for s in sent] == [True] * 100 + [False] * 100 + [True] * 100
    assert [s.offset for s in sent[100:200]] == [s.offset for s in before]
    new = [s.offset for s in sent[:100] + sent[200:]]
    assert new == sorted(new) and min(new) > max(s.offset for s in before)
    assert_offsets_match(sent)


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


@pytest.mark.django_db(transaction=True)
def test_a_connection_not_in_utf8mb4_is_refused_before_any_write() -> None:
    """Issue 13: a latin1 session stored ``kéy🦆`` as mojibake; now nothing is written."""
    from django.db import connection

    from sqlqueue.exceptions import ConfigurationError
    from sqlqueue.models import QueueMessage

    if connection.vendor != "mysql":
        pytest.skip("character sets of the connection are MySQL/MariaDB's")
    connection.close()  # a fresh connection: checked once per connection
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET NAMES latin1")
        for publish in (lambda: send_message("latin.test", {}, partition_key="kéy🦆"),
                        lambda: send_messages("latin.test", [{"n": 1}, {"n": 2}])):
            with pytest.raises(ConfigurationError, match=r"character set 'latin1'.*utf8mb4"):
                publish()
        with connection.cursor() as cursor:
            cursor.execute("SET NAMES utf8mb4")
        assert not QueueMessage.objects.filter(topic="latin.test").exists()
        sent = send_message("latin.test", {}, partition_key="kéy🦆")
        assert QueueMessage.objects.get(offset=sent.offset).partition_key == "kéy🦆"
    finally:
        connection.close()


def test_the_character_set_is_read_once_per_connection() -> None:
    connection.close()
    with CaptureQueriesContext(connection) as first:
        send_message("t", 1)
    with CaptureQueriesContext(connection) as second:
        send_messages("t", [2, 3])
    extra = 1 if connection.vendor == "mysql" else 0
    # PostgreSQL: a batch's wake-up is a pg_notify of its own (one message's is in its
    # INSERT).
    notify = 1 if connection.vendor == "postgresql" else 0
    assert [q["sql"] for q in first][:extra] == [
        "SELECT @@character_set_connection, @@max_allowed_packet"] * extra
    assert len(first) == 1 + extra
    assert len(second) == 1 + notify, [q["sql"][:80] for q in second]


class _Victim:
    """The store's insert, failing its first ``times`` calls as a deadlock victim would
    (a Galera certification conflict is reported the same way)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
        store_class = type(store_for(connection))
        real = store_class.insert_messages
        self.calls = 0

        def insert(store: Any, cursor: Any, rows: Any, **options: Any) -> Any:
            self.calls += 1
            if self.calls <= times:
                raise OperationalError("injected: deadlock victim")
            return real(store, cursor, rows, **options)

        monkeypatch.setattr(store_class, "insert_messages", insert)
        monkeypatch.setattr(store_class, "is_lock_wait",
                            lambda store, error: "deadlock victim" in str(error))


@pytest.mark.django_db(transaction=True)
def test_a_publish_of_its_own_is_tried_again_after_a_deadlock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    victim = _Victim(monkeypatch, times=2)
    sent = send_message("t", {"n": 1}, partition_key="k", id="order-1")
    assert sent.created and victim.calls == 3
    batch = send_messages("t", (OutgoingMessage(n, partition_key="k") for n in range(3)))
    assert [s.created for s in batch] == [True] * 3  # the generator was read once, kept
    victim.calls = 0
    named = send_messages("t", messages=(OutgoingMessage(n, partition_key="j")
                                         for n in range(2)))
    assert [s.created for s in named] == [True, True]
    assert len(stored_messages()) == 6


class _RecordedPauses(ManualSeconds):
    """A manual host clock that keeps each pause it was asked to make."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        super().sleep(seconds)


@pytest.mark.django_db(transaction=True)
def test_a_publish_of_its_own_gives_up_after_its_tries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlqueue.publishing import api

    clock = _RecordedPauses()
    monkeypatch.setattr(api, "RETRY_CLOCK", clock)
    victim = _Victim(monkeypatch, times=api.ALONE_TRIES)
    with pytest.raises(OperationalError, match="deadlock victim"):
        send_message("t", {"n": 1}, partition_key="k")
    assert victim.calls == api.ALONE_TRIES and not stored_messages()
    first = api.ALONE_FIRST_PAUSE
    # doubling pauses, on the publishing path's own clock (nothing else's time moved)
    assert clock.pauses == [first * 2 ** n for n in range(api.ALONE_TRIES - 1)]


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_inside_the_callers_transaction_is_the_callers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    victim = _Victim(monkeypatch, times=1)
    with pytest.raises(OperationalError, match="deadlock victim"), transaction.atomic():
        send_message("t", {"n": 1}, partition_key="k")
    assert victim.calls == 1 and not stored_messages()


def test_a_message_larger_than_the_servers_packet_is_refused_before_it_is_sent(
        settings: Any) -> None:
    """N4/F7: payload and metadata each within MAX_PAYLOAD_BYTES, but together, escaped,
    larger than max_allowed_packet (the audit's 6 + 6 MiB of quotes on a 16 MiB server):
    InvalidMessage before anything is sent, never "server has gone away"; the
    connection stays usable and nothing is stored."""
    if connection.vendor != "mysql":
        pytest.skip("MySQL and MariaDB inline rows in one packet (max_allowed_packet)")
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    if packet > 64 << 20:
        pytest.skip(f"max_allowed_packet is {packet} bytes: too large to fill in a test")
    quotes = '"' * (packet // 6)  # 2x as JSON, 4x escaped: payload + metadata > packet
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": packet // 2}
    with pytest.raises(InvalidMessage, match="max_allowed_packet"):
        send_message("big", quotes, metadata={"k": quotes})
    with pytest.raises(InvalidMessage, match=r"message 1: .*max_allowed_packet"):
        send_messages("big", [OutgoingMessage(1), OutgoingMessage(quotes,
                                                                  metadata={"k": quotes})])
    assert send_message("big", "still connected").created
    assert [m["payload"] for m in stored_messages("big")] == ["still connected"]


HOSTILE_TEXT = ["x'); DROP TABLE queue_messages; --", "\\", "\\'", '"', "%s", "%(x)s", "`", "$1"]


def test_hostile_names_and_values_are_stored_as_data() -> None:
    """SECURITY.md, "No SQL injection": quotes, backslashes, placeholders and statement
    text in names, payloads and metadata are stored and read back as they are."""
    for n, text in enumerate(HOSTILE_TEXT):
        send_message(f"t{text}", text, partition_key=text, id=f"{n}{text}",
                     metadata={text: text})
    send_messages("batch", [OutgoingMessage(t, partition_key=t, id=t, metadata={t: t})
                            for t in HOSTILE_TEXT])
    rows = stored_messages()
    assert [(r["topic"], r["partition_key"], r["payload"], r["metadata"]) for r in rows] == [
        *((f"t{t}", t, t, {t: t}) for t in HOSTILE_TEXT),
        *(("batch", t, t, {t: t}) for t in HOSTILE_TEXT),
    ]
