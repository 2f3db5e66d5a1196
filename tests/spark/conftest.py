"""One local Spark session for the whole test session, and helpers for streams.

Spark's executors connect to the test database by URL, on connections of their own, so
every test here that touches the database is transactional (``db_url`` commits for
real and flushes afterwards). The JVM and Spark's Python workers run in America/New_York
(only they: this process keeps its time zone), so that a timestamp that relied on a
local time zone anywhere would show up wrong.

Skipped when PySpark or Java is missing, unless SQLQUEUE_REQUIRE_SPARK=1 (``make test``
sets it, so that CI cannot skip them silently).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sqlqueue.integrations.spark.session import find_java_home

SPARK_TIME_ZONE = "America/New_York"
WAIT = 120.0  # seconds a stream may take to catch up (its first batch takes ~10 s)


def _spark_or_skip() -> None:
    required = os.environ.get("SQLQUEUE_REQUIRE_SPARK") == "1"
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        if required:
            raise
        pytest.skip(f"the Spark extra is not installed ({exc})", allow_module_level=True)
    if find_java_home() is None and shutil.which("java") is None:
        if required:
            raise RuntimeError("SQLQUEUE_REQUIRE_SPARK=1 but no Java runtime is installed")
        pytest.skip("no Java runtime for Spark", allow_module_level=True)


_spark_or_skip()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from sqlqueue.spark import local_session

    previous = os.environ.get("TZ")
    os.environ["TZ"] = SPARK_TIME_ZONE  # inherited by the JVM we start now, and its workers
    try:
        session = local_session("sqlqueue-tests", cores=2, config={
            # One retry per task, as on a cluster (a test makes a task fail once).
            "spark.master": "local[2,2]",
            "spark.sql.session.timeZone": SPARK_TIME_ZONE,
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": f"-Duser.timezone={SPARK_TIME_ZONE}",
            # Progress events of idle triggers, which the stream tests wait on.
            "spark.sql.streaming.noDataProgressEventInterval": "100ms",
        })
    finally:
        if previous is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = previous
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def db_url(transactional_db: None) -> str:
    """The test database as the source's ``url`` option (committed data, flushed after)."""
    from sqlqueue.spark import database_url

    return database_url()


@pytest.fixture
def streams(spark: Any) -> Iterator[Callable[..., Any]]:
    """Start streaming queries that are stopped after the test, whatever happens."""
    started: list[Any] = []

    def start(writer: Any) -> Any:
        query = writer.start()
        started.append(query)
        return query

    yield start
    for query in started:
        if query.isActive:
            query.stop()


class Collector:
    """A foreachBatch sink that keeps every row it was given, batch by batch."""

    def __init__(self, *columns: str) -> None:
        self.columns = columns or ("offset", "id", "payload")
        self.batches: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = [row.asDict() for row in frame.select(*self.columns).collect()]
        with self.lock:
            self.batches.append(rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        with self.lock:
            return [row for batch in self.batches for row in batch]

    def ids(self) -> list[str]:
        return [row["id"] for row in self.rows]


def wait_until(condition: Callable[[], Any], what: str, query: Any = None,
               timeout: float = WAIT) -> Any:
    """Poll ``condition`` until it is truthy; fail naming ``what`` (and the query's
    error, if the query died) when it does not come true in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if query is not None and query.exception() is not None:
            pytest.fail(f"the stream failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
