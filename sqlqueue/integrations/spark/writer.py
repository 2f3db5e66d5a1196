"""Batch writes: ``df.write.format("sqlqueue").option("topic", T).mode("append").save()``.

Each row is published as a message. Every Spark task commits its rows in transactions of
``batchSize`` rows: on PostgreSQL by COPY into a staging table and one INSERT that skips
stored keys (``sql.postgresql``); elsewhere by multi-row INSERTs that skip stored keys,
or, with ``bulkLoad=on`` on MySQL/MariaDB, by ``LOAD DATA LOCAL INFILE`` (the fast path;
INSERT again when the server refuses local files). A LOAD runs on a connection opened for
it, whose local-infile handler serves the chunk's CSV from memory under one random name
and refuses any other file a server asks for (``infile``); no connection has ``local_infile`` on. A
task that Spark retries publishes the same ids again (they come from the rows), and
idempotent publish stores each once.

``LOAD DATA`` drops a row that breaks a constraint with only a warning, so after each load
the stored count is compared with the sent one; a shortfall that duplicates do not explain
rolls the chunk back and sends it again through INSERT, which reports the real error.

Tasks write at the same time, and InnoDB's duplicate-key checks lock gaps of the unique
index, so two chunks can deadlock: rows go in key order (the same lock order everywhere),
and a chunk whose transaction the server rolled back (deadlock, lock wait timeout) is
sent again, a few times, after a random pause.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pa_csv
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from sqlqueue.integrations.spark.connect import Connection
from sqlqueue.integrations.spark.errors import BulkLoadMismatch
from sqlqueue.integrations.spark.infile import BulkLoadUnavailable, MemoryInfile
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.rows import Prepared, RowPreparer
from sqlqueue.literals import escaped_length
from sqlqueue.storage.chunks import statement_chunks
from sqlqueue.storage.retry import retry_victims
from sqlqueue.storage.statements import PostgreSQLStatements

logger = logging.getLogger("sqlqueue.spark")

ROWS_PER_INSERT = 500  # as the core store's Store.max_rows_per_insert
BYTES_PER_INSERT = 4 << 20  # under max_allowed_packet (16 MiB on MariaDB by default)
KEYS_PER_LOOKUP = 500
#: server or client refuses LOAD DATA LOCAL: 1148 ER_NOT_ALLOWED_COMMAND, 2068
#: CR_LOAD_DATA_LOCAL_INFILE_REJECTED, 3948 ER_CLIENT_LOCAL_FILES_DISABLED, 4166 (MariaDB)
LOCAL_INFILE_REFUSED = {1148, 2068, 3948, 4166}
#: the server rolled the transaction back for a lock conflict: 1205 lock wait timeout,
#: 1213 deadlock; on PostgreSQL 40P01 deadlock, 55P03 lock not available, 40001
#: serialization failure. The chunk is sent again.
TRANSIENT = {1205, 1213}
TRANSIENT_SQLSTATES = {"40P01", "55P03", "40001"}
ATTEMPTS = 6
CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")
CSV_SCHEMA = pa.schema([
    ("partition_key", pa.string()), ("id", pa.string()), ("payload", pa.string()),
    ("metadata", pa.string()), ("published_at", pa.int64()), ("priority", pa.int32()),
    ("deliver_after", pa.int64()),
])


def _log_retry(exc: Exception, tried: int) -> None:
    logger.info("Chunk rolled back by the server (%s); attempt %s of %s.", exc, tried + 1,
                ATTEMPTS)


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task did."""

    sent: int = 0
    inserted: int = 0
    bulk_loaded: int = 0  # rows that went through LOAD DATA


class ChunkPublisher:
    """Publishes prepared rows of one topic, a transaction per chunk."""

    def __init__(self, options: SourceOptions, db: Connection,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.sleep = sleep  # between a deadlock victim's tries (None: time.sleep)
        self.topic = options.require_topic("publish")
        self.database = options.database
        self.db = db
        self.bulk = options.bulk_load and db.sql.vendor == "mysql"
        self.report = WriteReport()

    def publish(self, rows: Sequence[Prepared]) -> None:
        """One chunk, in its own transaction; sent again after a deadlock."""
        ordered = sorted(rows, key=lambda row: (row[0], row[1]))
        retry_victims(lambda: self._publish(ordered), tries=ATTEMPTS,
                      is_victim=_rolled_back_for_a_lock,
                      pause=lambda tried: random.uniform(0.05, 0.1) * 2 ** tried,
                      on_retry=_log_retry, sleep=self.sleep)
        self.report.sent += len(rows)

    def _publish(self, rows: Sequence[Prepared]) -> None:
        if isinstance(self.db.sql, PostgreSQLStatements):
            self.report.inserted += self._copy(rows, self.db.sql)
            return
        if self.bulk:
            try:
                self.report.inserted += self._load(rows)
                self.report.bulk_loaded += len(rows)
                return
            except BulkLoadMismatch as exc:
                logger.warning("%s; sending the chunk again through INSERT.", exc)
            except BulkLoadUnavailable as exc:
                logger.warning("LOAD DATA LOCAL is unavailable (%s); publishing through "
                               "INSERT.", exc)
                self.bulk = False
            except Exception as exc:
                if _error_code(exc) not in LOCAL_INFILE_REFUSED:
                    raise  # a deadlock too: publish() sends the chunk again
                logger.warning("LOAD DATA LOCAL is refused (%s); publishing through INSERT.",
                               exc)
                self.bulk = False
        self.report.inserted += self._insert(rows)

    def _insert(self, rows: Sequence[Prepared]) -> int:
        inserted = 0
        with self.db.transaction():
            for chunk in _statement_chunks(rows):
                inserted += self.db.run(self.db.sql.store_new_messages(self.topic, chunk))
        return inserted

    def _copy(self, rows: Sequence[Prepared], sql: PostgreSQLStatements) -> int:
        """PostgreSQL: COPY into a staging table of the transaction's own, then one
        INSERT that skips stored ids (``sqlqueue.storage.statements.bulk``)."""
        with self.db.transaction():
            self.db.run(sql.create_staging())
            self.db.copy_rows(sql.copy_staging(), (
                (partition_key, message_id, payload.encode("utf-8"), *rest)
                for partition_key, message_id, payload, *rest in rows))
            return self.db.run(sql.publish_staged(self.topic))

    def _load(self, rows: Sequence[Prepared]) -> int:
        """One LOAD statement on a connection opened for it (see ``infile``)."""
        infile = MemoryInfile(_csv_bytes(rows))
        with self.database.connect(bulk_load=True) as db:
            infile.install(db.raw)
            with db.transaction():
                inserted = db.run(db.sql.load_messages(infile.name, self.topic))
                if not infile.served:
                    raise BulkLoadMismatch("the server did not ask for the rows' data")
                if inserted != len(rows):
                    self._check_all_stored(db, rows, inserted)
        if infile.refused:
            logger.warning("The server asked for local file(s) %r; refused.",
                           [name[:64] for name in infile.refused])
        return inserted

    def _check_all_stored(self, db: Connection, rows: Sequence[Prepared],
                          inserted: int) -> None:
        """Rows LOAD DATA skipped must be duplicates of stored ones, or it dropped them."""
        keys = sorted({(row[0], row[1]) for row in rows})
        stored = 0
        for first in range(0, len(keys), KEYS_PER_LOOKUP):
            stored += len(db.rows(db.sql.select_message_offsets(
                self.topic, keys[first:first + KEYS_PER_LOOKUP])))
        if stored != len(keys):
            raise BulkLoadMismatch(
                f"LOAD DATA stored {inserted} of {len(rows)} rows and {len(keys) - stored} "
                "are missing (the server dropped them with a warning)")


def _rolled_back_for_a_lock(exc: BaseException) -> bool:
    return (_error_code(exc) in TRANSIENT
            or getattr(exc, "sqlstate", None) in TRANSIENT_SQLSTATES)


def _error_code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


def _statement_chunks(rows: Sequence[Prepared]) -> Iterator[Sequence[Prepared]]:
    return statement_chunks(rows, max_rows=ROWS_PER_INSERT, max_bytes=BYTES_PER_INSERT,
                            size_of=_row_bytes)


def _row_bytes(row: Prepared) -> int:
    # Escaped bytes (mysqlclient inlines the parameters): a payload of quotes doubles.
    return (escaped_length(row[2].encode("utf-8")) + 2048
            + (escaped_length(row[3].encode("utf-8")) if row[3] else 0))


def _csv_bytes(rows: Sequence[Prepared]) -> bytes:
    """The rows as CSV for LOAD DATA: every value quoted (so that no string is read as
    the word NULL), quotes doubled, NULL as an empty unquoted field."""
    columns = list(zip(*rows, strict=True))
    table = pa.Table.from_arrays([pa.array(list(values), field.type)
                                  for values, field in zip(columns, CSV_SCHEMA, strict=True)],
                                 schema=CSV_SCHEMA)
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(table, sink, CSV_OPTIONS)
    return bytes(sink.getvalue().to_pybytes())


class MessageWriter(DataSourceArrowWriter):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        preparer = RowPreparer(self.options, where=_task_name())
        pending: list[Prepared] = []
        with self.options.database.connect() as db:
            publisher = ChunkPublisher(self.options, db)
            for batch in iterator:
                pending.extend(preparer.prepare(batch))
                while len(pending) >= self.options.batch_size:
                    publisher.publish(pending[:self.options.batch_size])
                    del pending[:self.options.batch_size]
            if pending:
                publisher.publish(pending)
        return publisher.report

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        reports = [m for m in messages if isinstance(m, WriteReport)]
        sent = sum(r.sent for r in reports)
        inserted = sum(r.inserted for r in reports)
        logger.info("Published %s row(s) to %r: %s new message(s), %s already stored.",
                    sent, self.options.topic, inserted, sent - inserted)


def _task_name() -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return "this task"
    return f"Spark partition {context.partitionId()} (attempt {context.attemptNumber()})"
