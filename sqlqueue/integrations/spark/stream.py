"""Streaming reads: ``spark.readStream.format("sqlqueue")``.

The stream's offset is ``{"offset": N}``: every row of the log below N has been planned.
``latestOffset`` moves N only over *settled* offsets (``horizon``), so a message whose
publishing transaction commits late, below rows already visible, is never skipped
(guarantee I4): the stream waits for it. Spark checkpoints the offsets of each micro-batch;
after a restart it replays an unfinished batch with the same range, and a finished one
never again.

With ``consumerGroup`` the stream is a consumer group (``group``): Spark calls
``latestOffset(start)`` only once everything below ``start`` went through the sink, so
that is when the group acks it; ``commit(end)`` acks too (Spark calls it one batch late).
While the group is paused (``manage.py queue pause``, read at most once a second)
``latestOffset`` offers nothing new: no micro-batch starts, the one running finishes, and
the group keeps its leases.

These methods run on the driver, in a Python process Spark starts for the stream (no
Django there either), except ``read()``, which runs on executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sqlqueue.consuming.pauses import Pause, PauseWatch
from sqlqueue.integrations.spark.connect import Connection
from sqlqueue.integrations.spark.group import ConsumerGroup
from sqlqueue.integrations.spark.horizon import Horizon, settled_end
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.reader import range_partitions, read_batches
from sqlqueue.integrations.spark.tables import Column

logger = logging.getLogger("sqlqueue.spark")

SCAN_LIMIT = 1_000_000  # rows examined per planning when Spark sets no row limit


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, columns: Sequence[Column]) -> None:
        self.options = options
        self.columns = tuple(columns)
        self.group = ConsumerGroup(options) if options.consumer_group else None
        self.horizon = Horizon(options.max_transaction_age_ms)
        self._db: Connection | None = None
        self._registered = False
        self._available_now = False  # trigger(availableNow=True) ...
        self._available_now_end: int | None = None  # ... and where it stops
        self._pauses: PauseWatch | None = None  # a consumer group's, on the driver

    # The reader is pickled for the executors: the driver's connection stays behind.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_db"] = None
        state["_pauses"] = None
        return state

    def _connection(self) -> Connection:
        if self._db is None:
            self._db = self.options.database.connect()
        return self._db

    def _reconnecting(self) -> Connection:
        """The driver's connection, opened again if the server dropped it."""
        db = self._connection()
        try:
            db.one(db.sql.database_now_ms())
        except Exception:  # a dead connection: make a new one
            db.close()
            self._db = None
            db = self._connection()
        return db

    # -- offsets ----------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        db = self._reconnecting()
        if self.group is not None:
            position = self.group.position(db)
            if position is not None:
                return {"offset": position}  # a group resumes where it stands
        starting = self.options.starting_offsets
        if starting.isascii() and starting.isdigit():
            return {"offset": int(starting)}
        head_row = db.one(db.sql.head_offset())
        head = int(head_row[0]) if head_row and head_row[0] is not None else 0
        if starting == "latest":
            return {"offset": head + 1}
        bounds = db.one(db.sql.log_bounds(self.options.table, None))
        return {"offset": int(bounds[0]) if bounds and bounds[0] is not None else 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_rows_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        db = self._reconnecting()
        first = int(start["offset"])
        if self.group is not None:
            self._keep_group(db, first)
            if self._paused():
                return {"offset": first}  # nothing new while an operator pauses the group
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not isinstance(limit, ReadMaxRows | ReadAllAvailable):
            max_rows = self.options.max_rows_per_trigger
        if self._available_now and self._available_now_end is None:
            self._available_now_end = settled_end(db, first, None, self.horizon, SCAN_LIMIT)
        end = settled_end(db, first, max_rows, self.horizon, SCAN_LIMIT)
        if self._available_now_end is not None:
            end = min(end, max(first, self._available_now_end))
        return {"offset": max(first, end)}

    def _keep_group(self, db: Connection, start: int) -> None:
        assert self.group is not None
        head_row = db.one(db.sql.head_offset())
        head = int(head_row[0]) if head_row and head_row[0] is not None else 0
        if not self._registered:
            self.group.register(db, start, head)
            self._registered = True
        else:
            self.group.tick(db, head)
        # Spark plans a batch from ``start`` only after every batch before it went
        # through the sink and into the checkpoint's commit log.
        self.group.ack_below(db, start)

    def _paused(self) -> bool:
        if self._pauses is None:
            self._pauses = PauseWatch(self._read_pauses)
        self._pauses.refresh()
        return self._pauses.paused(self.options.consumer_group or "", self.options.topic or "")

    def _read_pauses(self) -> list[Pause]:
        db = self._connection()
        return [(str(group), str(topic)) for group, topic in db.rows(db.sql.list_pauses())]

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: stop at what is settled now (measured from the
        query's start offset, at its first planning, which follows at once)."""
        self._available_now = True

    def reportLatestOffset(self) -> dict[str, int] | None:
        db = self._reconnecting()
        head_row = db.one(db.sql.head_offset())
        return {"offset": int(head_row[0]) + 1} if head_row and head_row[0] else None

    # -- micro-batches ------------------------------------------------------------------------
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return range_partitions(self.options, int(start["offset"]), int(end["offset"]))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from read_batches(self.options, self.columns, partition.value,
                                group=self.options.consumer_group)

    def commit(self, end: dict[str, int]) -> None:
        if self.group is not None:
            db = self._reconnecting()
            self.group.ack_below(db, int(end["offset"]))

    def stop(self) -> None:
        if self._db is None:
            return
        try:
            if self.group is not None and self._registered:
                self.group.leave(self._db)
        finally:
            self._db.close()
            self._db = None
