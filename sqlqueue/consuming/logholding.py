"""No log write while a runner's transaction holds its lease rows.

A log write can block: standard error piped to a process that stopped reading (a full
pipe), a stalled log collector, a paused terminal. Inside a cycle transaction that means
share locks on the runner's lease rows held for as long as it blocks, and the other
runners unable to take its partitions over (the wave-4 rerun saw 12 minutes on MariaDB).
So what the runner's main thread logs inside such a transaction waits, and is written
once the transaction has ended (committed or rolled back). The server's bound on idle
transactions (``ServerWatch``) covers what this cannot: a process frozen whole.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import transaction

#: the loggers of what runs inside a runner's cycle transaction
HELD_LOGGERS = ("sqlqueue.consumer", "sqlqueue.leases")


class HeldLogs(logging.Filter):
    """A filter on ``HELD_LOGGERS`` while ``holding()``: the records the holding thread
    logs are kept, and handled after the block; other threads' pass."""

    def __init__(self) -> None:
        super().__init__()
        self._thread: int | None = None
        self._held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self._thread is not None and threading.get_ident() == self._thread:
            self._held.append(record)
            return False
        return True

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Keep this thread's records of ``HELD_LOGGERS`` until the block ends."""
        loggers = [logging.getLogger(name) for name in HELD_LOGGERS]
        self._thread = threading.get_ident()
        for logger in loggers:
            logger.addFilter(self)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(self)
            self._thread = None
            held, self._held = self._held, []
            for record in held:
                logging.getLogger(record.name).handle(record)


@contextmanager
def atomic_then_logs(alias: str, on_error: Callable[[], None]) -> Iterator[None]:
    """``transaction.atomic(using=alias)``, what this thread logs inside it written once
    it has ended (the runner's fenced transactions). ``on_error``: called first when it
    fails (before any other statement: ``ServerWatch.note_error``)."""
    with HeldLogs().holding():
        try:
            with transaction.atomic(using=alias):
                yield
        except BaseException:
            on_error()
            raise
