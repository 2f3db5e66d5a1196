"""Errors of the Spark data source.

Spark executors and the driver's planner processes import these without Django; they
derive from ``sqlqueue.SqlqueueError`` (whose module imports no Django) and from
``ValueError``/``RuntimeError``. Spark reports them wrapped in its own exceptions, with
this message in the text.
"""

from __future__ import annotations

from sqlqueue.exceptions import SqlqueueError


class SparkSourceError(SqlqueueError):
    """Root of the data source's errors."""


class InvalidOption(SparkSourceError, ValueError):
    """An option of ``format("sqlqueue")`` is missing, unknown or out of range; raised
    while Spark plans the query, before anything is read or written."""


class InvalidRow(SparkSourceError, ValueError):
    """A row to publish breaks a rule of ``send_message`` (the message names the row and
    the rule); raised before the chunk that holds the row is written. Chunks committed
    before it (this task's earlier ones, other tasks') stay: fix the data and run the job
    again, and only the missing messages are added."""


class GroupNotExclusive(SparkSourceError, RuntimeError):
    """Another subscriber (a ``runconsumer`` worker, another stream) works for the
    consumer group a stream was given; a Spark consumer group must be the only one."""


class BulkLoadMismatch(SparkSourceError, RuntimeError):
    """``LOAD DATA`` stored fewer rows than were sent and some were not duplicates (the
    server dropped rows with a warning); the chunk was rolled back."""
