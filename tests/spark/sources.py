"""Data sources for tests, in a module Spark's workers can import (no Django here)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sqlqueue.integrations.spark.connect import Database

PADDING = "x" * 8192  # rows this big fill the workers' 64 KiB socket buffers: they flow


class FlakyRows(DataSource):
    """30 rows in one partition. The first attempt fails at row 25, once the writer has
    committed at least one chunk of 10 (the number it saw goes to the ``report`` file),
    so the retry sends rows that are already stored."""

    @classmethod
    def name(cls) -> str:
        return "sqlqueue_test_flaky"

    def schema(self) -> str:
        return "payload string, id string"

    def reader(self, schema: Any) -> DataSourceReader:
        return FlakyReader(self.options["url"], self.options["report"])


class FlakyReader(DataSourceReader):
    def __init__(self, url: str, report: str) -> None:
        self.url = url
        self.report = report

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        context = TaskContext.get()
        first_attempt = context is not None and context.attemptNumber() == 0
        for n in range(30):
            if first_attempt and n == 25:
                seen = self._wait_for_committed(10)
                with open(self.report, "w") as report:
                    report.write(str(seen))
                raise RuntimeError("injected failure after a partial write")
            yield json.dumps({"n": n, "padding": PADDING}), f"row-{n}"

    def _wait_for_committed(self, count: int) -> int:
        deadline = time.monotonic() + 30
        with Database.from_url(self.url).connect() as db:
            while True:
                row = db.one(("SELECT COUNT(*) FROM queue_messages", []))
                seen = int(row[0]) if row else 0
                if seen >= count or time.monotonic() > deadline:
                    return seen
                time.sleep(0.05)
