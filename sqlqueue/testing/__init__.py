"""Testing consumers and tasks inside your own tests (docs/guides/testing.md).

::

    from sqlqueue.testing import advance_clock, capture_messages, run_consumers

``capture_messages()`` records what a block publishes; ``run_consumers()`` runs the
registered consumers in this thread, on its connection and inside its transaction (a
``django.test.TestCase`` works), through ``runconsumer``'s delivery code, until nothing is
deliverable now; ``advance_clock()`` makes retries and scheduled messages due without
waiting. The pytest plugin (``sqlqueue.testing.pytest_plugin``) offers them as fixtures.

Importing this module needs Django's settings configured (it imports the models).
"""

from __future__ import annotations

from sqlqueue.testing.capture import CapturedMessage, CapturedMessages, capture_messages
from sqlqueue.testing.clock import advance_clock, clock_offset_ms, reset_clock
from sqlqueue.testing.runs import RunReport, run_consumers

__all__ = [
    "CapturedMessage",
    "CapturedMessages",
    "RunReport",
    "advance_clock",
    "capture_messages",
    "clock_offset_ms",
    "reset_clock",
    "run_consumers",
]
