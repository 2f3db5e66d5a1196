"""Batch writes: rows published as messages, idempotently, then consumed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from sqlqueue.integrations.spark.errors import InvalidRow
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.rows import RowPreparer
from sqlqueue.integrations.spark.writer import ChunkPublisher
from sqlqueue.models import QueueMessage
from tests.conftest import stored_messages
from tests.integration.consuming_helpers import drain, register  # noqa: F401
from tests.spark.sources import FlakyRows

TRICKY = [
    {"text": 'double "quotes", commas, and a \\ backslash'},
    {"text": "a raw\nnewline and a \r carriage return"},
    {"text": "NULL"},
    {"text": "ünïcødé ✓ 😀"},
    {"text": "", "empty": [], "nested": {"deep": [1, 2.5, None, True]}},
]


def writer(frame: Any, url: str, topic: str = "loaded", **options: str) -> Any:
    write = frame.write.format("sqlqueue").option("url", url).option("topic", topic)
    for key, value in options.items():
        write = write.option(key, value)
    return write.mode("append")


def test_write_then_consume(spark: Any, db_url: str,
                            register: Callable[..., Any]) -> None:  # noqa: F811
    frame = spark.createDataFrame(
        [({"order": n, "amount": f"{n}.50"}, f"customer-{n % 4}", f"order-{n}", {"src": "spark"})
         for n in range(40)],
        "payload struct<order:int, amount:string>, partition_key string, id string, "
        "metadata map<string,string>",
    ).repartition(3)
    writer(frame, db_url).save()

    stored = stored_messages("loaded")
    assert len(stored) == 40
    assert {m["id"] for m in stored} == {f"order-{n}" for n in range(40)}
    first = next(m for m in stored if m["id"] == "order-3")
    assert first["payload"] == {"order": 3, "amount": "3.50"}
    assert (first["partition_key"], first["metadata"], first["priority"]) == (
        "customer-3", {"src": "spark"}, 50)

    received: list[int] = []
    register("loaded", "billing", lambda message: received.append(message.payload["order"]))
    drain(["billing"])
    assert sorted(received) == list(range(40))


@pytest.mark.parametrize("bulk_load", ["on", "off"])
def test_values_round_trip_and_a_second_write_adds_nothing(spark: Any, db_url: str,
                                                           bulk_load: str) -> None:
    rows = [(json.dumps(p, ensure_ascii=False, indent=1), f"id-{n}", "NULL" if n == 2 else None)
            for n, p in enumerate(TRICKY)]
    frame = spark.createDataFrame(rows, "payload string, id string, partition_key string")
    writer(frame, db_url, bulkLoad=bulk_load).save()
    writer(frame, db_url, bulkLoad=bulk_load).save()  # a re-run: everything is stored
    stored = {m["id"]: m for m in stored_messages("loaded")}
    assert len(stored) == len(TRICKY)
    for n, payload in enumerate(TRICKY):
        message = stored[f"id-{n}"]
        assert message["payload"] == payload
        raw = QueueMessage.objects.get(offset=message["offset"]).payload
        assert bytes(raw).decode() == rows[n][0]  # JSON text is stored as it was written
    assert stored["id-2"]["partition_key"] == "NULL"  # a string, not SQL's NULL
    assert stored["id-0"]["metadata"] is None


def test_rows_without_ids_are_deduplicated_by_content(spark: Any, db_url: str) -> None:
    frame = spark.createDataFrame([(f'{{"n": {n % 5}}}',) for n in range(10)], "payload string")
    writer(frame, db_url).save()
    writer(frame.repartition(4), db_url).save()
    assert sorted(m["payload"]["n"] for m in stored_messages("loaded")) == [0, 1, 2, 3, 4]


# -- a task that Spark retries ------------------------------------------------------------

def test_a_retried_task_does_not_duplicate(spark: Any, db_url: str, tmp_path: Any) -> None:
    spark.dataSource.register(FlakyRows)
    report = tmp_path / "committed-before-the-failure"
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5")  # rows flow early
    try:
        frame = (spark.read.format("sqlqueue_test_flaky").option("url", db_url)
                 .option("report", str(report)).load())
        writer(frame, db_url, batchSize="10").save()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    committed_by_the_failed_attempt = int(report.read_text())
    assert committed_by_the_failed_attempt >= 10
    ids = [m["id"] for m in stored_messages("loaded")]
    assert sorted(ids) == sorted(f"row-{n}" for n in range(30))


# -- refusals ------------------------------------------------------------------------------

def test_bad_frames_are_refused_before_anything_is_written(spark: Any, db_url: str) -> None:
    frame = spark.createDataFrame([("x", 1)], "body string, priority string")
    with pytest.raises(Exception, match=r"needs a 'payload' column.*unknown column 'body'"):
        writer(frame, db_url).save()
    ok = spark.createDataFrame([('"x"',)], "payload string")
    with pytest.raises(Exception, match="append-only"):
        writer(ok, db_url).mode("overwrite").save()
    with pytest.raises(Exception, match="option 'topic' is required"):
        ok.write.format("sqlqueue").option("url", db_url).mode("append").save()
    with pytest.raises(Exception, match="bytes long; the limit is 251 bytes"):
        writer(ok, db_url, topic="t" * 252).save()
    assert QueueMessage.objects.count() == 0


def test_a_bad_row_fails_its_task_with_its_number(spark: Any, db_url: str) -> None:
    frame = spark.createDataFrame([('{"ok": 1}',), ("{broken",)], "payload string").coalesce(1)
    bad_row = r"row 2 of Spark partition 0 \(attempt \d\): Expecting property name"
    with pytest.raises(Exception, match=bad_row):
        writer(frame, db_url).save()
    assert QueueMessage.objects.count() == 0  # the task validates a chunk before writing it


# -- the LOAD DATA safety net ------------------------------------------------------------------

def test_rows_load_data_drops_are_detected_and_sent_again(db_url: str, mysql_only: None) -> None:
    """LOAD DATA LOCAL drops a row breaking a CHECK constraint with only a warning. The
    writer notices the shortfall, rolls the chunk back and sends it through INSERT,
    which fails loudly instead."""
    import pyarrow as pa

    options = SourceOptions.parse({"url": db_url, "topic": "checked", "bulkLoad": "on"})
    rows = list(RowPreparer(options).prepare(pa.RecordBatch.from_pylist(
        [{"payload": '{"n": 1}', "id": "fine"}, {"payload": '{"n": 2}', "id": "poison"}])))
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_messages ADD CONSTRAINT test_no_poison "
                       "CHECK (id <> 'poison')")
    try:
        with options.database.connect() as db:
            publisher = ChunkPublisher(options, db)
            with pytest.raises(Exception, match="test_no_poison"):
                publisher.publish(rows)
        assert QueueMessage.objects.count() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE queue_messages DROP CONSTRAINT test_no_poison")


def test_invalid_rows_raise_before_any_chunk(db_url: str) -> None:
    import pyarrow as pa

    options = SourceOptions.parse({"url": db_url, "topic": "t"})
    batch = pa.RecordBatch.from_pylist([{"payload": "1"}, {"payload": "nope"}])
    with pytest.raises(InvalidRow, match="row 2"):
        list(RowPreparer(options).prepare(batch))


def test_insert_chunks_are_sized_by_escaped_bytes() -> None:
    """F7 of the security audit, for the Spark writer's INSERT path."""
    from sqlqueue.integrations.spark.writer import BYTES_PER_INSERT, _statement_chunks
    from sqlqueue.literals import escaped_length

    payload = '"' + '\\"' * (700 << 10) + '"'
    rows = [("k", f"m{n}", payload, None, 0, 100, 0) for n in range(6)]
    chunks = list(_statement_chunks(rows))
    assert sum(len(c) for c in chunks) == 6
    for chunk in chunks:
        assert sum(escaped_length(r[2].encode()) for r in chunk) <= BYTES_PER_INSERT
