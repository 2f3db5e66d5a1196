"""Testing consumers and tasks inside your own tests (docs/guides/testing.md).

::

    from sqlqueue.testing import advance_clock, capture_messages, run_consumers

``make_message()`` builds a delivery for a handler's unit test. ``capture_messages()``
records what a block publishes; ``run_consumers()`` runs the registered consumers in this
thread, on its connection and inside its transaction (a ``django.test.TestCase`` works),
through ``runconsumer``'s delivery code, until nothing is deliverable now;
``advance_clock()`` makes retries and scheduled messages due without waiting. The pytest
plugin (``sqlqueue.testing.pytest_plugin``) offers them as fixtures. A run's report keeps
what failing handlers raised (``raise_errors=True`` raises the first); both refuse a
database Django's test setup did not create (``allow_any_database=True`` aside).

The names are loaded on first use, like ``sqlqueue``'s: pytest imports the plugin, in
this package, before Django's settings are configured (or in projects without Django).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue.testing.capture import CapturedMessage, CapturedMessages, capture_messages
    from sqlqueue.testing.clock import advance_clock, clock_offset_ms, reset_clock
    from sqlqueue.testing.databases import NotATestDatabase
    from sqlqueue.testing.failures import HandlerFailure
    from sqlqueue.testing.messages import make_message
    from sqlqueue.testing.runs import RunReport, run_consumers

_EXPORTS = {
    "CapturedMessage": "sqlqueue.testing.capture",
    "CapturedMessages": "sqlqueue.testing.capture",
    "HandlerFailure": "sqlqueue.testing.failures",
    "NotATestDatabase": "sqlqueue.testing.databases",
    "RunReport": "sqlqueue.testing.runs",
    "advance_clock": "sqlqueue.testing.clock",
    "capture_messages": "sqlqueue.testing.capture",
    "clock_offset_ms": "sqlqueue.testing.clock",
    "make_message": "sqlqueue.testing.messages",
    "reset_clock": "sqlqueue.testing.clock",
    "run_consumers": "sqlqueue.testing.runs",
}

__all__ = [
    "CapturedMessage",
    "CapturedMessages",
    "HandlerFailure",
    "NotATestDatabase",
    "RunReport",
    "advance_clock",
    "capture_messages",
    "clock_offset_ms",
    "make_message",
    "reset_clock",
    "run_consumers",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sqlqueue.testing' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
