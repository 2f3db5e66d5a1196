"""How long a value is once escaped into a MySQL string literal (sqlqueue.literals)."""

from __future__ import annotations

import pytest

from sqlqueue.literals import escaped_length

SPECIAL = b"\0\n\r\x1a'\"\\"


@pytest.mark.parametrize("data", [
    b"", b"plain", b'{"text":"a \\"quoted\\" word"}', SPECIAL, SPECIAL * 3 + b"tail",
    bytes(range(256)), "ünïcødé ✓ 😀".encode(),
])
def test_every_special_byte_counts_twice(data: bytes) -> None:
    assert escaped_length(data) == len(data) + sum(data.count(bytes([b])) for b in SPECIAL)


def test_only_the_seven_bytes_mysql_escapes_are_special() -> None:
    others = bytes(b for b in range(256) if b not in SPECIAL)
    assert escaped_length(others) == len(others)
    assert escaped_length(SPECIAL) == 2 * len(SPECIAL)
