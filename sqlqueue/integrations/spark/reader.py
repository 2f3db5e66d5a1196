"""Batch reads: ``spark.read.format("sqlqueue")``.

The log (``messages``, ``dead_letters``) is read in offset ranges, one Spark partition
each, as Arrow batches streamed from the server; the small tables in one partition.
``partitions()`` runs on the driver, ``read()`` on executors: both open their own
connection (connections cannot be pickled).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sqlqueue.integrations.spark.arrow import record_batch
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.tables import Column

OffsetSlice = tuple[int, int]  # [lo, hi)


def split_offsets(lo: int, hi: int, parts: int) -> list[OffsetSlice]:
    """[lo, hi) cut into ``parts`` contiguous ranges of nearly equal width."""
    width = hi - lo
    if width <= 0:
        return []
    parts = max(1, min(parts, width))
    bounds = [lo + width * n // parts for n in range(parts + 1)]
    return [(bounds[n], bounds[n + 1]) for n in range(parts)]


def range_partitions(options: SourceOptions, lo: int, hi: int) -> list[InputPartition]:
    """The Spark partitions of [lo, hi): ``numPartitions``, or one per
    ``offsetsPerPartition`` offsets."""
    parts = options.num_partitions or -(-(hi - lo) // options.offsets_per_partition)
    return [InputPartition(rng) for rng in split_offsets(lo, hi, parts)]


def read_batches(options: SourceOptions, columns: Sequence[Column], rng: OffsetSlice | None,
                 group: str | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of one partition (a range of the log, or a whole small table)."""
    with options.database.connect() as db:
        if rng is None:
            statement = db.sql.table_rows(options.table, columns, options.topic)
        else:
            statement = db.sql.rows_in_range(options.table, columns, rng[0], rng[1],
                                             options.topic, group)
        for chunk in db.batches(statement, options.fetch_size):
            yield record_batch(chunk, columns)


class LogReader(DataSourceReader):
    def __init__(self, options: SourceOptions, columns: Sequence[Column]) -> None:
        self.options = options
        self.columns = tuple(columns)

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        if not options.table.by_offset:
            return [InputPartition(None)]
        with options.database.connect() as db:
            row = db.one(db.sql.log_bounds(options.table, options.topic))
        low, high = (row or (None, None))[:2]
        if low is None or high is None:
            return [InputPartition((0, 0))]  # nothing stored: one empty partition
        lo, hi = int(low), int(high) + 1
        if options.from_offset is not None:
            lo = max(lo, options.from_offset)
        if options.until_offset is not None:
            hi = min(hi, options.until_offset)
        return range_partitions(options, lo, hi) or [InputPartition((0, 0))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from read_batches(self.options, self.columns, partition.value)
