"""Database rows to Arrow record batches, in exactly the types Spark expects.

A Python data source may yield ``pyarrow.RecordBatch`` es instead of tuples, which is
2-3x faster, but their schema must match Spark's Arrow schema of the declared columns
(``int64``, ``int32``, ``bool``, ``string``, ``timestamp[us, tz=UTC]``) or the read fails
with DATA_SOURCE_RETURN_SCHEMA_MISMATCH. Epoch milliseconds become UTC timestamps here,
in Arrow, never through naive Python datetimes (which Spark would read as local time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sqlqueue.integrations.spark.tables import Column

UTC_MICROS = pa.timestamp("us", tz="UTC")
ARROW_TYPES: dict[str, pa.DataType] = {
    "long": pa.int64(),
    "int": pa.int32(),
    "bool": pa.bool_(),
    "text": pa.string(),
    "bytes": pa.string(),
    "ms": UTC_MICROS,
    "ms0": UTC_MICROS,
}


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.kind]) for c in columns])


def record_batch(rows: Sequence[Sequence[Any]], columns: Sequence[Column]) -> pa.RecordBatch:
    """``rows`` as fetched (one value per column, in order) -> a batch for Spark."""
    values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    arrays = [_array(list(column_values), column)
              for column_values, column in zip(values, columns, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(columns))


def _array(values: list[Any], column: Column) -> pa.Array:
    kind = column.kind
    if kind in ("ms", "ms0"):
        return epoch_ms_to_timestamps(pa.array(values, pa.int64()), zero_is_null=kind == "ms0")
    if kind == "bytes":
        return _utf8(values)
    if kind == "text":
        return pa.array([_text(v) for v in values], pa.string())
    if kind == "bool":
        return pa.array([None if v is None else bool(v) for v in values], pa.bool_())
    return pa.array(values, ARROW_TYPES[kind])


def epoch_ms_to_timestamps(millis: pa.Array, *, zero_is_null: bool = False) -> pa.Array:
    if zero_is_null:
        millis = pc.if_else(pc.equal(millis, 0), pa.scalar(None, pa.int64()), millis)
    return pc.multiply(millis, 1000).cast(UTC_MICROS)


def timestamps_to_epoch_micros(values: pa.Array) -> list[int | None]:
    """Spark timestamps -> epoch microseconds. The instant counts, not the time zone
    label (an Arrow writer gets the session's zone, a reader gives UTC)."""
    return values.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _utf8(values: list[Any]) -> pa.Array:
    """Payload bytes as strings; the rare row another RFC implementation filled with
    bytes that are not UTF-8 gets replacement characters rather than failing the read."""
    raw = pa.array([v.encode("utf-8") if isinstance(v, str) else v for v in values],
                   pa.binary())
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([_text(v) for v in values], pa.string())
