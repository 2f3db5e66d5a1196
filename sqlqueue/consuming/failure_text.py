"""The texts of a handler's failure, which must never fail themselves: the traceback
stored with a retry or a dead letter, and the exception's description in a log line.
Both are made safe and capped (``storable_text``, guarantee I15)."""

from __future__ import annotations

import traceback

from sqlqueue.naming import storable_text


def error_text(exc: BaseException) -> str:
    """The traceback to store: made safe and capped (``storable_text``, guarantee I15). An
    exception that cannot even be formatted (a hostile ``__str__`` is handled by
    ``traceback`` itself; a RecursionError on a deep chain is not) is named by its type."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = f"{type_path(exc)}: <the exception could not be formatted>"
    return storable_text(text)


def described(exc: BaseException) -> str:
    """``repr(exc)`` for a log line, never raising (a hostile ``__repr__``), capped."""
    try:
        text = repr(exc)
    except Exception:
        text = f"<{type_path(exc)} whose repr() failed>"
    return storable_text(text, max_chars=1000)


def type_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"
