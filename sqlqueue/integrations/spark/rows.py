"""Rows of a DataFrame -> messages to publish, with the rules of ``send_message``.

Executors cannot import Django, so the rules of sqlqueue.publishing are restated here
for Arrow batches; tests/spark/test_units.py checks that both agree. A row's id, when it
has none, is derived from its content, so a retried Spark task (or a re-run job)
publishes the same ids, which idempotent publish stores once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any

import pyarrow as pa

from sqlqueue.integrations.spark.arrow import timestamps_to_epoch_micros
from sqlqueue.integrations.spark.errors import InvalidOption, InvalidRow
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.naming import (
    DEFAULT_PRIORITY,
    MAX_JSON_DEPTH,
    check_json_depth,
    check_name,
    unkeyed_partition,
)

CONTENT_ID_PREFIX = "sha256:"

#: The columns a DataFrame to publish may have: name -> the Spark types accepted.
WRITE_COLUMNS: dict[str, tuple[str, ...]] = {
    "payload": (),  # any type: a string is JSON text, anything else is encoded as JSON
    "partition_key": ("string",),
    "id": ("string",),
    "metadata": ("map<string,string>", "string"),
    "priority": ("tinyint", "smallint", "int", "bigint"),
    "deliver_at": ("timestamp",),
    "published_at": ("timestamp",),
}

#: A prepared message: (partition_key, id, payload, metadata, published_at, priority,
#: deliver_after), in the column order of the INSERT statements.
Prepared = tuple[str, str, str, str | None, int, int, int]


def check_write_schema(fields: Mapping[str, str]) -> None:
    """``fields``: column name -> Spark simple type. Raises InvalidOption naming every
    problem (before anything is written)."""
    problems = []
    names = {name.lower(): name for name in fields}
    if "payload" not in names:
        problems.append("the DataFrame needs a 'payload' column")
    for lower, name in names.items():
        accepted = WRITE_COLUMNS.get(lower)
        if accepted is None:
            problems.append(f"unknown column {name!r} (the columns are "
                            f"{', '.join(WRITE_COLUMNS)})")
        elif accepted and fields[name] not in accepted:
            problems.append(f"column {name!r} is {fields[name]}; it must be "
                            f"{' or '.join(accepted)}")
    if problems:
        raise InvalidOption("cannot publish this DataFrame: " + "; ".join(problems))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _jsonable(value: Any) -> Any:
    """Spark values -> what json.dumps takes, as DjangoJSONEncoder would encode them."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, date | time_of_day):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        raise ValueError("binary values cannot be encoded as JSON")
    return value


def encode_row_payload(value: Any, max_bytes: int) -> str:
    if value is None:
        raise ValueError("payload is NULL")
    try:
        if isinstance(value, str):
            check_json_depth("payload", value)  # before the decoder recurses
            json.loads(value, parse_constant=_reject_constant)  # must be JSON text already
            text = value
        else:
            text = json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False)
            check_json_depth("payload", text)
    except RecursionError:
        raise ValueError(f"payload nests lists and objects more than {MAX_JSON_DEPTH} "
                         "deep") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ValueError(f"payload is {size} bytes as JSON; the limit is {max_bytes} bytes "
                         "(option maxPayloadBytes)")
    return text


def encode_row_metadata(value: Any, max_bytes: int) -> str | None:
    if value is None:
        return None
    mapping = json.loads(value) if isinstance(value, str) else value
    if not isinstance(mapping, dict):
        raise ValueError("metadata must be a JSON object of strings")
    for key, item in mapping.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(f"metadata must map strings to strings; {key!r} is "
                             f"{type(item).__name__}")
        if "\x00" in key or "\x00" in item:
            raise ValueError(f"metadata {key[:50]!r} contains the NUL character (U+0000), "
                             "which databases cannot store as text")
    if not mapping:
        return None  # the RFC stores NULL for an empty map
    text = json.dumps(mapping, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8")) > max_bytes:
        raise ValueError(f"metadata is larger than {max_bytes} bytes as JSON")
    return text


def content_id(partition_key: str | None, payload: str, metadata: str | None,
               priority: int | None, deliver_after: int | None,
               published_at: int | None) -> str:
    """The id of a row that has none: the same content gives the same id."""
    digest = hashlib.sha256(json.dumps(
        [partition_key, payload, metadata, priority, deliver_after, published_at],
        ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()
    return CONTENT_ID_PREFIX + digest


@dataclass
class RowPreparer:
    """Turns Arrow batches into prepared messages, numbering rows for error messages."""

    options: SourceOptions
    where: str = "this task"  # for errors: which Spark partition
    seen: int = 0

    def prepare(self, batch: pa.RecordBatch) -> Iterator[Prepared]:
        columns = {name.lower(): self._values(batch, name) for name in batch.schema.names}
        now_ms = time.time_ns() // 1_000_000
        for index in range(batch.num_rows):
            self.seen += 1
            try:
                yield self._prepare_one({k: v[index] for k, v in columns.items()}, now_ms)
            except (ValueError, TypeError) as exc:
                raise InvalidRow(f"row {self.seen} of {self.where}: {exc}") from None

    @staticmethod
    def _values(batch: pa.RecordBatch, name: str) -> list[Any]:
        column = batch.column(name)
        if pa.types.is_timestamp(column.type):
            return timestamps_to_epoch_micros(column)
        return column.to_pylist(maps_as_pydicts="strict")  # type: ignore[no-any-return]

    def _prepare_one(self, row: dict[str, Any], now_ms: int) -> Prepared:
        options = self.options
        payload = encode_row_payload(row.get("payload"), options.max_payload_bytes)
        metadata = encode_row_metadata(row.get("metadata"), options.max_payload_bytes)
        priority = row.get("priority")
        if priority is not None and not 0 <= priority <= 255:
            raise ValueError(f"priority must be between 0 and 255; got {priority}")
        deliver_micros, published_micros = row.get("deliver_at"), row.get("published_at")
        # Round a delivery time up (never deliver early), a publish time down.
        deliver_after = None if deliver_micros is None else max(0, -(-deliver_micros // 1000))
        published_at = None if published_micros is None else published_micros // 1000
        if published_at is not None and published_at < 0:
            raise ValueError("published_at is before 1970")
        partition_key = row.get("partition_key")
        message_id = row.get("id")
        if message_id is None:
            message_id = content_id(partition_key, payload, metadata, priority, deliver_after,
                                    published_at)
        check_name("id", message_id)
        if partition_key is None:
            partition_key = unkeyed_partition(message_id, options.default_partitions)
        check_name("partition_key", partition_key)
        return (partition_key, message_id, payload, metadata,
                now_ms if published_at is None else published_at,
                DEFAULT_PRIORITY if priority is None else int(priority),
                deliver_after or 0)
