"""The rule for names (topics, partition keys, ids, groups), without Django: the
publishing API and the Spark executors, which must not import Django, share it."""

from __future__ import annotations

from typing import Any

MAX_NAME_BYTES = 255  # VARCHAR(255) columns of the RFC schema


def check_name(kind: str, value: Any, max_bytes: int = MAX_NAME_BYTES) -> str:
    """A non-empty str of printable characters, at most ``max_bytes`` in UTF-8; raises
    ValueError naming the problem."""
    if not isinstance(value, str):
        raise ValueError(f"{kind} must be a string, not {type(value).__name__}.")
    if not value:
        raise ValueError(f"{kind} must not be empty.")
    if value.isascii() and value.isprintable():
        size = len(value)  # the common case, checked in C: one byte per character
    else:
        bad = next((ch for ch in value if ord(ch) < 32 or 127 <= ord(ch) < 160), None)
        if bad is not None:
            raise ValueError(f"{kind} {value[:50]!r} contains the control character {bad!r}.")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"{kind} {value[:50]!r} is not valid Unicode text.") from None
    if size > max_bytes:
        raise ValueError(f"{kind} is {size} bytes long; the limit is {max_bytes} bytes.")
    return value
