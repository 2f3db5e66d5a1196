"""The data source's pure parts: no Spark session, no database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sqlqueue.exceptions import InvalidMessage
from sqlqueue.integrations.spark.connect import Database
from sqlqueue.integrations.spark.errors import InvalidOption, InvalidRow
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.reader import split_offsets
from sqlqueue.integrations.spark.rows import (
    RowPreparer,
    check_write_schema,
    content_id,
    unkeyed_partition,
)
from sqlqueue.naming import check_name
from sqlqueue.publishing import messages as publishing

pytestmark = pytest.mark.database_independent  # no database: run once (Makefile)
EXECUTOR_MODULES = ("source", "reader", "writer", "stream", "group", "horizon", "rows",
                    "connect", "tables")


def test_executor_modules_import_without_django() -> None:
    """What Spark's workers import (the source's module by name) loads no Django."""
    imports = "; ".join(f"import sqlqueue.integrations.spark.{m}" for m in EXECUTOR_MODULES)
    code = (f"import sys; {imports}; "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'django'); "
            "print(loaded); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("value", [
    "ok", "", "a\tb", "a\x7fb", "\x85x", "é" * 127, "é" * 128, "x" * 255, "x" * 256,
    "with space", "\ud800",
])
def test_names_follow_the_publishing_rules(value: str) -> None:
    try:
        publishing.check_message_name("id", value)
        expected = None
    except InvalidMessage as exc:
        expected = str(exc)
    try:
        check_name("id", value)
        got = None
    except ValueError as exc:
        got = str(exc)
    assert got == expected


def test_unkeyed_partitions_follow_publishing() -> None:
    # One rule, defined once (sqlqueue.naming): a Spark retry lands on send_message's key.
    assert unkeyed_partition is publishing.unkeyed_partition


def test_split_offsets() -> None:
    assert split_offsets(10, 20, 3) == [(10, 13), (13, 16), (16, 20)]
    assert split_offsets(10, 12, 5) == [(10, 11), (11, 12)]
    assert split_offsets(5, 5, 2) == []


@pytest.mark.parametrize(("url", "expected"), [
    ("mysql://u:p%40ss@db.example:3307/shop", ("mysql", "shop", "db.example", 3307, "u", "p@ss")),
    ("mysql://root@127.0.0.1/test", ("mysql", "test", "127.0.0.1", 3306, "root", "")),
    ("postgres://u:p%2Fw@pg.example/shop", ("postgresql", "shop", "pg.example", 5432, "u",
                                            "p/w")),
    ("postgresql://root@127.0.0.1:6432/test", ("postgresql", "test", "127.0.0.1", 6432, "root",
                                               "")),
    ("sqlite:////tmp/a.sqlite3", ("sqlite", "/tmp/a.sqlite3", "", 3306, "", "")),
    ("sqlite:///relative.db", ("sqlite", "relative.db", "", 3306, "", "")),
])
def test_urls(url: str, expected: tuple[Any, ...]) -> None:
    db = Database.from_url(url)
    assert (db.vendor, db.name, db.host, db.port, db.user, db.password) == expected
    assert not db.password or db.password not in db.describe()


def test_a_postgresql_socket_and_tls() -> None:
    from sqlqueue.integrations.spark.connect import Tls

    db = Database.from_url("postgres://app@localhost/shop?host=/var/run/postgresql",
                           tls=Tls("verify-identity", ca="/ca.pem"))
    assert (db.unix_socket, db.describe()) == (
        "/var/run/postgresql", "postgres://app@/var/run/postgresql/shop")
    assert db.tls is not None
    assert db.tls.libpq_kwargs() == {"sslmode": "verify-full", "sslrootcert": "/ca.pem"}


def test_user_and_password_options_override_the_url() -> None:
    options = SourceOptions.parse({"url": "mysql://a:b@h/d", "user": "x",
                                   "password": "s3cret"})
    assert (options.database.user, options.database.password) == ("x", "s3cret")
    assert "s3cret" not in options.database.describe()


def test_options_are_case_insensitive_and_checked() -> None:
    options = SourceOptions.parse({"url": "sqlite:////tmp/x", "NUMPARTITIONS": "4",
                                   "maxrowspertrigger": "7", "startingOffsets": "Latest"})
    assert (options.num_partitions, options.max_rows_per_trigger) == (4, 7)
    assert options.starting_offsets == "latest"
    with pytest.raises(InvalidOption, match="'leaseRenewInterval' must be shorter"):
        SourceOptions.parse({"url": "sqlite:////tmp/x", "leaseDuration": "5",
                             "leaseRenewInterval": "5"})
    with pytest.raises(InvalidOption, match="'untilOffset' is below 'fromOffset'"):
        SourceOptions.parse({"url": "sqlite:////tmp/x", "fromOffset": "9", "untilOffset": "3"})
    for bad in ("-1", "²", "١٢"):  # digits to str.isdigit(), not to int()
        with pytest.raises(InvalidOption, match="startingOffsets"):
            SourceOptions.parse({"url": "sqlite:////tmp/x", "startingOffsets": bad})


def test_write_schema_problems_are_all_named() -> None:
    check_write_schema({"payload": "struct<a:int>", "id": "string", "priority": "int"})
    with pytest.raises(InvalidOption) as raised:
        check_write_schema({"body": "string", "priority": "string"})
    text = str(raised.value)
    assert "needs a 'payload' column" in text
    assert "unknown column 'body'" in text
    assert "column 'priority' is string" in text


def prepare(rows: list[dict[str, Any]], schema: pa.Schema | None = None,
            **options: str) -> list[tuple[Any, ...]]:
    settings = SourceOptions.parse({"url": "sqlite:////tmp/x", "topic": "t", **options})
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    return list(RowPreparer(settings).prepare(batch))


def test_rows_without_an_id_get_one_from_their_content() -> None:
    first = prepare([{"payload": '{"a": 1}'}, {"payload": '{"a": 2}'}])
    again = prepare([{"payload": '{"a": 2}'}, {"payload": '{"a": 1}'}])
    assert {row[1] for row in first} == {row[1] for row in again}
    assert first[0][1] == content_id(None, '{"a": 1}', None, None, None, None)
    assert first[0][0] == unkeyed_partition(first[0][1], 16)
    assert first[0][2] == '{"a": 1}'  # JSON text is stored as given


def test_rows_of_every_column_kind() -> None:
    schema = pa.schema([
        ("payload", pa.struct([("amount", pa.decimal128(5, 2)),
                               ("at", pa.timestamp("us", "UTC"))])),
        ("metadata", pa.map_(pa.string(), pa.string())), ("priority", pa.int64()),
        ("deliver_at", pa.timestamp("us", "America/New_York")),
        ("published_at", pa.timestamp("us", "UTC")), ("partition_key", pa.string()),
        ("id", pa.string()),
    ])
    at = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    (row,) = prepare([{
        "payload": {"amount": Decimal("12.50"), "at": at}, "metadata": [("k", "v")],
        "priority": 7, "deliver_at": at, "published_at": at, "partition_key": "p", "id": "i",
    }], schema)
    millis = int(at.timestamp() * 1000)
    assert row == ("p", "i", '{"amount":"12.50","at":"2026-01-02T03:04:05.678901Z"}',
                   '{"k":"v"}', millis, 7, millis + 1)  # delivery rounds up, publish down


@pytest.mark.parametrize(("row", "message"), [
    ({"payload": "{not json"}, "row 1 of this task"),
    ({"payload": "NaN"}, "NaN is not JSON"),
    ({"payload": None}, "payload is NULL"),
    ({"payload": '"x"', "priority": 300}, "priority must be between 0 and 255"),
    ({"payload": '"x"', "id": ""}, "id must not be empty"),
    ({"payload": '"x"', "partition_key": "a\nb"}, "control character"),
    ({"payload": '"x"', "metadata": '{"a": 1}'}, "metadata must map strings to strings"),
    ({"payload": '"' + "x" * 2000 + '"'}, "payload is 2002 bytes as JSON; the limit is 1000"),
])
def test_bad_rows_are_named(row: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRow, match=message):
        prepare([row], maxPayloadBytes="1000")


class CountingDatabase:
    """Just enough of a Connection for Horizon: a MySQL-like clock, and INNODB_TRX as a
    snapshot listing (oldest writer, newest transaction)."""

    def __init__(self) -> None:
        from sqlqueue.storage.statements import statements_for

        self.sql = statements_for("mysql")
        self.now_ms = 1_000_000
        self.snapshot: tuple[int | None, int | None] = (None, 1_000_000)
        self.horizon_reads = 0
        self.began: str | None = None  # the open transaction, by how it began
        self.read_in: list[str | None] = []

    @contextmanager
    def transaction(self, begin: str | None = None) -> Iterator[None]:
        self.began = begin or self.sql.begin_sql
        try:
            yield
        finally:
            self.began = None

    galera = 0  # @@wsrep_on

    def one(self, statement: tuple[str, list[Any]]) -> tuple[Any, ...]:
        if "wsrep_on" in statement[0]:
            return (self.galera,)
        if "INNODB_TRX" in statement[0]:
            self.horizon_reads += 1
            self.read_in.append(self.began)
            return self.snapshot
        return (self.now_ms,)


def test_on_a_galera_node_the_horizon_does_not_trust_innodb_trx() -> None:
    # A node lists only its own transactions: a publisher open on another node would be
    # missed. The horizon assumes the longest transaction allowed instead (issue 15).
    from sqlqueue.integrations.spark.horizon import Horizon

    db = CountingDatabase()
    db.galera = 1
    assert Horizon(300_000)(db) == db.now_ms - 300_000  # type: ignore[arg-type]
    assert db.horizon_reads == 0


def test_the_horizon_reads_innodb_trx_at_most_twice_a_second() -> None:
    """Reading INNODB_TRX more often than every 0.1 s keeps InnoDB's snapshot of it
    stale for every reader on the server."""
    from sqlqueue.horizon import MARGIN_MS
    from sqlqueue.integrations.spark.horizon import Horizon

    db = CountingDatabase()
    horizon = Horizon(300_000)
    values = {horizon(db) for _ in range(50)}  # type: ignore[arg-type]
    assert db.horizon_reads == 1
    assert values == {1_000_000 - MARGIN_MS}
    # In a transaction of its own that InnoDB lists at once, so a fresh snapshot has it.
    assert db.read_in == ["START TRANSACTION WITH CONSISTENT SNAPSHOT"]


def test_the_horizon_keeps_its_last_value_through_a_stale_snapshot() -> None:
    import pickle

    from sqlqueue.horizon import MARGIN_MS
    from sqlqueue.integrations.spark.horizon import Horizon

    db = CountingDatabase()
    horizon = Horizon(300_000)
    assert horizon(db) == 1_000_000 - MARGIN_MS  # type: ignore[arg-type]
    horizon = pickle.loads(pickle.dumps(horizon))  # as it lands on the stream's driver
    db.now_ms, db.snapshot = 1_030_000, (None, 990_000)  # stale: taken 40 s ago
    assert horizon(db) == 1_000_000 - MARGIN_MS  # type: ignore[arg-type]
    db.now_ms, db.snapshot = 1_031_000, (1_010_000, 1_031_000)  # fresh, with a writer
    horizon.cache.expires = 0.0
    assert horizon(db) == 1_010_000 - MARGIN_MS  # type: ignore[arg-type]
    assert db.horizon_reads == 3


class DeadlockingDatabase:
    """A Connection whose first INSERT the server "rolls back" for a deadlock."""

    def __init__(self) -> None:
        from sqlqueue.storage.statements import statements_for

        self.sql = statements_for("sqlite")
        self.inserts: list[list[Any]] = []

    def transaction(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()

    def run(self, statement: tuple[str, list[Any]]) -> int:
        self.inserts.append(statement[1])
        if len(self.inserts) == 1:
            raise RuntimeError(1213, "Deadlock found when trying to get lock")
        return len(statement[1]) // 8


def test_a_chunk_rolled_back_by_a_deadlock_is_sent_again_in_key_order() -> None:
    from sqlqueue.integrations.spark import writer

    options = SourceOptions.parse({"url": "sqlite:////tmp/x", "topic": "t"})
    db = DeadlockingDatabase()
    publisher = writer.ChunkPublisher(options, db,  # type: ignore[arg-type]
                                      sleep=lambda seconds: None)
    rows = [("b", "2", "{}", None, 1, 50, 0), ("a", "9", "{}", None, 1, 50, 0),
            ("b", "1", "{}", None, 1, 50, 0)]
    publisher.publish(rows)
    assert len(db.inserts) == 2  # the first attempt, then the retry
    assert [(p[1], p[2]) for p in [db.inserts[1][i:i + 8] for i in range(0, 24, 8)]] == [
        ("a", "9"), ("b", "1"), ("b", "2")]
    assert (publisher.report.sent, publisher.report.inserted) == (3, 3)


class PostgreSQLDeadlock(Exception):
    sqlstate = "40P01"  # as psycopg's errors.DeadlockDetected


class DeadlockingPostgreSQL(DeadlockingDatabase):
    """The same, on PostgreSQL: the first COPY's transaction is rolled back."""

    def __init__(self) -> None:
        from sqlqueue.storage.statements import statements_for

        self.sql = statements_for("postgresql")
        self.inserts = []
        self.copies: list[list[Any]] = []

    def copy_rows(self, statement: tuple[str, list[Any]], rows: Any) -> None:
        self.copies.append(list(rows))
        if len(self.copies) == 1:
            raise PostgreSQLDeadlock("deadlock detected")

    def run(self, statement: tuple[str, list[Any]]) -> int:
        self.inserts.append(statement[1])  # create_staging, then publish_staged
        return len(self.copies[-1]) if statement[0].startswith("INSERT") else 0


def test_a_postgresql_chunk_rolled_back_by_a_deadlock_is_copied_again() -> None:
    from sqlqueue.integrations.spark import writer

    options = SourceOptions.parse({"url": "postgres://u@h/db", "topic": "t"})
    db = DeadlockingPostgreSQL()
    publisher = writer.ChunkPublisher(options, db,  # type: ignore[arg-type]
                                      sleep=lambda seconds: None)
    publisher.publish([("b", "2", "{}", None, 1, 50, 0), ("a", "9", "{}", None, 1, 50, 0)])
    assert [[(r[0], r[1]) for r in copy] for copy in db.copies] == [
        [("a", "9"), ("b", "2")], [("a", "9"), ("b", "2")]]
    assert db.copies[1][0][2] == b"{}"  # payloads go in as bytes (bytea)
    assert (publisher.report.sent, publisher.report.inserted) == (2, 2)


def test_only_shortened_topic_directories_hold_the_mark() -> None:
    """N7: a ``~`` of a topic is escaped, so a full directory is never a shortened one."""
    from sqlqueue.integrations.spark.archive_layout import is_shortened, topic_directory

    long_topic = "t" * 251
    for topic in ("a~b", "~", topic_directory(long_topic)[len("topic="):], "x" * 100):
        assert not is_shortened(topic_directory(topic)) or len(topic.encode()) > 240
        assert topic_directory(topic) != topic_directory(long_topic)
    assert topic_directory("a~b") == "topic=a%7Eb"
    assert is_shortened(topic_directory(long_topic))


def test_the_writer_refuses_a_hostile_deep_string_payload_in_linear_time() -> None:
    """N2: the audit's row (deep, then an unterminated string of escaped quotes) is
    refused by the Spark writer's payload check at once (hours with the old pattern;
    the bound is generous, not a benchmark)."""
    import time

    from sqlqueue.integrations.spark.rows import encode_row_metadata, encode_row_payload

    hostile = "[" * 101 + '"' + '\\"' * (512 * 1024)  # 1 MiB
    started = time.monotonic()
    with pytest.raises(ValueError, match="more than 100 deep"):
        encode_row_payload(hostile, 2 << 20)
    took = time.monotonic() - started
    # Bounds a hang, not a speed: backtracking would take hours here.
    assert took < 60, f"the depth check did not finish in {took:.0f} s: it backtracks"
    with pytest.raises(ValueError, match="NUL character"):
        encode_row_metadata({"k": "a\x00b"}, 1 << 20)
