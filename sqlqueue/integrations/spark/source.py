"""The ``sqlqueue`` Python Data Source: batch read, batch write and streaming read.

    from sqlqueue.spark import register
    register(spark)
    spark.read.format("sqlqueue").option("url", url).option("topic", "orders").load()

Spark runs these classes in its own Python processes (planners on the driver, workers on
executors), importing this module by name: nothing here imports Django, and the database
comes from the ``url`` option (docs/guides/spark.md).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.reader import LogReader
from sqlqueue.integrations.spark.rows import check_write_schema
from sqlqueue.integrations.spark.stream import LogStreamReader
from sqlqueue.integrations.spark.tables import Column, Table
from sqlqueue.integrations.spark.writer import MessageWriter

#: Spark's simple type names of our column kinds, to check a schema given with .schema()
SIMPLE_TYPES = {"long": "bigint", "int": "int", "boolean": "boolean", "string": "string",
                "timestamp": "timestamp"}


class SQLQueueDataSource(DataSource):
    """``format("sqlqueue")``: the queue's tables as DataFrames (docs/guides/spark.md)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.settings = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "sqlqueue"

    def schema(self) -> str:
        return self.settings.table.ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogReader(self.settings, selected_columns(self.settings.table, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = self.settings
        if settings.table.option != "messages":
            raise InvalidOption("a stream reads the message log: leave option 'table' out")
        if settings.consumer_group is not None:
            settings.require_topic("stream as a consumer group")
        return LogStreamReader(settings, selected_columns(settings.table, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        settings = self.settings
        if overwrite:
            raise InvalidOption("the message log is append-only: use mode('append')")
        if settings.table.option != "messages":
            raise InvalidOption("only messages can be written: leave option 'table' out")
        settings.require_topic("publish")
        check_write_schema({field.name: field.dataType.simpleString() for field in schema})
        return MessageWriter(settings)


def selected_columns(table: Table, schema: StructType) -> list[Column]:
    """The columns of a read: all of them, or those of a schema given with ``.schema()``
    (Python data sources get no column pruning: a narrower schema is how a job avoids
    fetching payloads it does not need)."""
    columns = []
    for field in schema.fields:
        column = table.column(field.name)
        expected = SIMPLE_TYPES[column.spark_type]
        if field.dataType.simpleString() != expected:
            raise InvalidOption(f"column {field.name!r} of table {table.option!r} is "
                                f"{expected}, not {field.dataType.simpleString()}")
        columns.append(column)
    return columns
