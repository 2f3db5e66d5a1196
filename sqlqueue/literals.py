"""How long a value is once escaped into a MySQL string literal, without Django (the
Spark writer sizes its statements with it too).

mysql_real_escape_string writes a backslash before NUL, LF, CR, Ctrl-Z, quote, double
quote and backslash (under NO_BACKSLASH_ESCAPES it doubles only the quote): a value of
those bytes doubles, so a statement must be sized by its escaped bytes, not its raw ones.
"""

from __future__ import annotations

_ESCAPED = b"\0\n\r\x1a'\"\\"


def escaped_length(data: bytes) -> int:
    """Bytes of ``data`` inside a MySQL string literal (an upper bound under every
    sql_mode). One pass in C: what ``translate`` deletes is what gets a backslash (a
    count per special byte made this a quarter of a bulk publish's time)."""
    return 2 * len(data) - len(data.translate(None, _ESCAPED))
