"""The tables the data source reads, as Spark sees them.

Every timestamp of the schema is epoch milliseconds (``BIGINT UNSIGNED``); Spark gets
``timestamp`` columns (UTC instants, whatever the session or process time zone).
Timestamps where 0 means "none" (``failed_at`` of a normal message, ``acked_at`` of an
unacked one, ...) become NULL. Payloads (UTF-8 JSON bytes) become strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.storage.statements.tables import (
    GROUP_KEY,
    HEARTBEAT_KEY,
    HEARTBEATS_TABLE,
    LEASES_TABLE,
    MESSAGE_TABLE,
    OFFSETS_TABLE,
    STATE_KEY,
    STATE_TABLE,
)

#: Column kinds and their Spark types.
SPARK_TYPES = {
    "long": "long",
    "int": "int",
    "bool": "boolean",
    "text": "string",
    "bytes": "string",  # UTF-8 bytes in the database (payloads)
    "ms": "timestamp",  # epoch milliseconds
    "ms0": "timestamp",  # epoch milliseconds, 0 = NULL
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str

    @property
    def spark_type(self) -> str:
        return SPARK_TYPES[self.kind]


def _columns(spec: str) -> tuple[Column, ...]:
    return tuple(Column(*item.split(":")) for item in spec.split())


MESSAGE_COLUMNS = _columns(
    "offset:long topic:text partition_key:text id:text payload:bytes metadata:text "
    "created_at:ms published_at:ms failed_at:ms0 failure_count:int last_error:text "
    "original_topic:text failure_detail:text priority:int deliver_after:ms0 "
    "consumer_group:text"
)


@dataclass(frozen=True)
class Table:
    """A table the ``table`` option can select."""

    option: str  # the value of option("table", ...)
    db_table: str
    columns: tuple[Column, ...]
    order_by: tuple[str, ...]  # the primary key: reads come in its order
    #: read in offset ranges (the log) rather than in one piece (the small tables)
    by_offset: bool = False
    #: the column the ``topic`` option filters on
    topic_column: str = "topic"

    @property
    def dead_letters_only(self) -> bool:
        """Its rows are the log's dead letters (``ExportStatements`` filters them)."""
        return self.option == "dead_letters"

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise InvalidOption(f"table {self.option!r} has no column {name!r}; its columns "
                            f"are {', '.join(c.name for c in self.columns)}")

    def ddl(self) -> str:
        """The Spark schema, as DDL."""
        return ", ".join(f"`{c.name}` {c.spark_type}" for c in self.columns)


TABLES = {
    table.option: table
    for table in (
        Table("messages", MESSAGE_TABLE, MESSAGE_COLUMNS, ("offset",), by_offset=True),
        # Dead letters are rows of the log too (their dead-letter topic); the topic
        # option names the topic they came from.
        Table("dead_letters", MESSAGE_TABLE, MESSAGE_COLUMNS, ("offset",), by_offset=True,
              topic_column="original_topic"),
        Table("delivery_state", STATE_TABLE, _columns(
            "consumer_group:text topic:text partition_key:text message_offset:long "
            "acked:bool invisible_until:ms0 retry_count:int postponed:bool acked_at:ms0 "
            "last_error:text"
        ), STATE_KEY),
        Table("offsets", OFFSETS_TABLE, _columns(
            "consumer_group:text topic:text partition_key:text offset_acked:long "
            "updated_at:ms"
        ), GROUP_KEY),
        Table("leases", LEASES_TABLE, _columns(
            "consumer_group:text topic:text partition_key:text leased_by:text leased_at:ms "
            "lease_renewed_at:ms generation:long"
        ), GROUP_KEY),
        Table("heartbeats", HEARTBEATS_TABLE, _columns(
            "consumer_group:text topic:text subscriber_name:text heartbeat_at:ms "
            "deregistered_at:ms0"
        ), HEARTBEAT_KEY),
    )
}


def table_named(option: str) -> Table:
    table = TABLES.get(option.strip().lower())
    if table is None:
        raise InvalidOption(f"option 'table' is {option!r}; use one of "
                            f"{', '.join(TABLES)}")
    return table
