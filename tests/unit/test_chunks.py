"""sqlqueue.storage.chunks: rows cut into statements by count and by size."""

from __future__ import annotations

from sqlqueue.storage.chunks import statement_chunks


def test_chunks_keep_the_order_and_both_limits() -> None:
    sizes = [3, 3, 3, 9, 1, 1, 1, 1]
    chunks = list(statement_chunks(sizes, max_rows=3, max_bytes=7, size_of=int))
    assert chunks == [[3, 3], [3], [9], [1, 1, 1], [1]]  # a row too large goes alone
    assert list(statement_chunks([], max_rows=3, max_bytes=7, size_of=int)) == []
