"""``run_consumers``: the registered consumers, run in the test's own transaction."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from sqlqueue.conf import get_settings
from sqlqueue.consuming.registry import Consumer, select_consumers
from sqlqueue.testing.databases import refuse_unless_test_databases
from sqlqueue.testing.failures import HandlerFailure
from sqlqueue.testing.inline import InlineRunner


@dataclass(frozen=True)
class RunReport:
    """What a ``run_consumers`` call did, over every consumer it ran."""

    acked: int = 0
    retried: int = 0  # failed (or raised Retry) and scheduled for another attempt
    dead_lettered: int = 0
    #: the handler calls that raised (other than Retry and Reject), in the order they ran:
    #: each with the message, the exception and its formatted traceback. Not compared:
    #: ``report == RunReport(retried=1)`` asks about the counts.
    errors: tuple[HandlerFailure, ...] = field(default=(), compare=False)


def run_consumers(*, group: str | None = None, topic: str | None = None,
                  max_messages: int | None = None, raise_errors: bool = False,
                  allow_any_database: bool = False) -> RunReport:
    """Run the registered consumers that match ``group`` and ``topic`` (None: all) in this
    thread, on its database connection, inside its current transaction (a
    ``django.test.TestCase``'s), until nothing is deliverable now; at most
    ``max_messages`` handler calls. Returns what happened.

    Delivery is ``runconsumer``'s: retries with backoff, dead letters after
    ``max_attempts``, ordered partitions, ``atomic=True`` handlers (in a savepoint), async
    handlers. A retry waiting on its backoff, or a message scheduled for later, is left
    for a later call: ``advance_clock()`` first to make it due.

    A handler that raises (anything but ``Retry`` and ``Reject``) fails its message as
    under ``runconsumer``, and the report's ``errors`` keep what it raised. With
    ``raise_errors=True`` the first one stops the run: what it handled is recorded (that
    message's failure too: it is retried or dead-lettered as usual), what it had not
    started is given back, the leases are released, and then the handler's exception is
    raised here, its traceback intact.

    Raises ``ConfigurationError`` if no registered consumer matches, and
    ``NotATestDatabase`` on a database that Django's test setup did not create, unless
    ``allow_any_database=True``."""
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1; got {max_messages!r}")
    consumers = select_consumers([group] if group else [], [topic] if topic else [])
    conf = get_settings()
    by_alias: dict[str, list[Consumer]] = {}
    for chosen in consumers:
        by_alias.setdefault(conf.alias_for(chosen.topic), []).append(chosen)
    if not allow_any_database:
        refuse_unless_test_databases("run_consumers()", by_alias)
    totals: Counter[str] = Counter()
    failures: list[HandlerFailure] = []
    budget = max_messages
    while not (raise_errors and failures):
        handled = 0
        # One runner per database (SQLQUEUE["ROUTES"]); again while a handler of one
        # published for another.
        for alias, on_alias in by_alias.items():
            if (budget is not None and budget <= 0) or (raise_errors and failures):
                break
            runner = InlineRunner(on_alias, dataclasses.replace(conf, DATABASE=alias),
                                  max_messages=budget, stop_at_first_failure=raise_errors)
            runner.run_here()
            for subscriber in runner.subscribers:
                totals.update(subscriber.stats)
            failures += runner.failures
            handled += runner.handled
            if budget is not None:
                budget -= runner.handled
        if len(by_alias) < 2 or not handled:
            break
    if raise_errors and failures:
        raise _annotated(failures[0])
    return RunReport(acked=totals["acked"], retried=totals["retried"],
                     dead_lettered=totals["dead_lettered"], errors=tuple(failures))


def _annotated(failure: HandlerFailure) -> BaseException:
    """The handler's exception, with a note (shown under its traceback) of the message it
    failed on."""
    note = f"Raised by a handler in run_consumers(raise_errors=True), on {failure.where}."
    try:
        if note not in getattr(failure.exception, "__notes__", ()):
            failure.exception.add_note(note)
    except TypeError:  # __notes__ made something else than a list
        pass
    return failure.exception
