"""Cutting rows into multi-row statements, without Django: one loop for publishing
(``sqlqueue.publishing.inserts``) and the Spark writer (``sqlqueue.integrations.spark.writer``),
each with its own limits and its own measure of what a row adds to a statement."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

_Row = TypeVar("_Row")


def statement_chunks(rows: Iterable[_Row], *, max_rows: int, max_bytes: int,
                     size_of: Callable[[_Row], int]) -> Iterator[list[_Row]]:
    """``rows`` in order, in chunks of at most ``max_rows`` rows whose ``size_of`` adds up
    to at most ``max_bytes`` (a row larger than that is a chunk of its own)."""
    chunk: list[_Row] = []
    size = 0
    for row in rows:
        row_bytes = size_of(row)
        if chunk and (len(chunk) >= max_rows or size + row_bytes > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_bytes
    if chunk:
        yield chunk
