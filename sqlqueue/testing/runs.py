"""``run_consumers``: the registered consumers, run in the test's own transaction."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from sqlqueue.conf import get_settings
from sqlqueue.consuming.registry import Consumer, select_consumers
from sqlqueue.testing.inline import InlineRunner


@dataclass(frozen=True)
class RunReport:
    """What a ``run_consumers`` call did, over every consumer it ran."""

    acked: int = 0
    retried: int = 0  # failed (or raised Retry) and scheduled for another attempt
    dead_lettered: int = 0


def run_consumers(*, group: str | None = None, topic: str | None = None,
                  max_messages: int | None = None) -> RunReport:
    """Run the registered consumers that match ``group`` and ``topic`` (None: all) in this
    thread, on its database connection, inside its current transaction (a
    ``django.test.TestCase``'s), until nothing is deliverable now; at most
    ``max_messages`` handler calls. Returns what happened.

    Delivery is ``runconsumer``'s: retries with backoff, dead letters after
    ``max_attempts``, ordered partitions, ``atomic=True`` handlers (in a savepoint), async
    handlers. A retry waiting on its backoff, or a message scheduled for later, is left
    for a later call: ``advance_clock()`` first to make it due. Raises
    ``ConfigurationError`` if no registered consumer matches."""
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1; got {max_messages!r}")
    consumers = select_consumers([group] if group else [], [topic] if topic else [])
    conf = get_settings()
    by_alias: dict[str, list[Consumer]] = {}
    for chosen in consumers:
        by_alias.setdefault(conf.alias_for(chosen.topic), []).append(chosen)
    totals: Counter[str] = Counter()
    budget = max_messages
    while True:
        handled = 0
        # One runner per database (SQLQUEUE["ROUTES"]); again while a handler of one
        # published for another.
        for alias, on_alias in by_alias.items():
            if budget is not None and budget <= 0:
                break
            runner = InlineRunner(on_alias, dataclasses.replace(conf, DATABASE=alias),
                                  max_messages=budget)
            runner.run_here()
            for subscriber in runner.subscribers:
                totals.update(subscriber.stats)
            handled += runner.handled
            if budget is not None:
                budget -= runner.handled
        if len(by_alias) < 2 or not handled:
            break
    return RunReport(acked=totals["acked"], retried=totals["retried"],
                     dead_lettered=totals["dead_lettered"])
