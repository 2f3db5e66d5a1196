"""Lease events for a history, from the ``sqlqueue.lease`` log event (``events.LEASE``,
DEBUG, logger ``sqlqueue.leases``) that every subscriber's ``LeaseKeeper`` emits: no hook
in the engine, only its log.

``recording(history, now_ms)`` records them in a history (the runners in this process: the
threaded workload, the stepped engine, whose clock ``now_ms`` is). ``LeaseLines`` writes
them one JSON object a line to a file (real ``runconsumer`` processes: ``bench.soak``'s
subscribers, the acceptance runs), and ``read_lines`` reads such files back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

from sqlqueue import events
from tests.history.model import History, LeaseEvent, now_ms

LOGGER = "sqlqueue.leases"


def lease_event(record: logging.LogRecord, now: float,
                runner: Callable[[str], str] = str) -> LeaseEvent | None:
    """The lease event a log record carries (None: another event). ``now``: this
    machine's (or the manual) clock when it was logged; ``runner``: the name runs and
    faults give the subscriber's process."""
    if getattr(record, "event", None) != events.LEASE:
        return None
    values = record.__dict__
    age = values.get("age_ms")
    return LeaseEvent(
        group=values["group"], partition=values["partition"], holder=values["subscriber"],
        runner=runner(values["subscriber"]), change=values["change"],
        generation=values.get("generation"), tenure=values.get("tenure"),
        at_ms=now - (age or 0))


class _ToHistory(logging.Handler):
    def __init__(self, history: History, now: Callable[[], float],
                 runner: Callable[[str], str]) -> None:
        super().__init__(logging.DEBUG)
        self.history, self.now, self.runner = history, now, runner

    def emit(self, record: logging.LogRecord) -> None:
        event = lease_event(record, self.now(), self.runner)
        if event is not None and event.group in self.history.groups:
            self.history.leased(event)


@contextlib.contextmanager
def recording(history: History, now: Callable[[], float] = now_ms,
              runner: Callable[[str], str] = str) -> Iterator[None]:
    """Record the lease events of this process's subscribers in ``history`` meanwhile."""
    handler = _ToHistory(history, now, runner)
    with _attached(handler):
        yield


class LeaseLines(logging.Handler):
    """Each lease event one line of JSON appended to ``path`` (one short ``O_APPEND``
    write, flushed: a line written before a SIGKILL is kept). ``runner`` is this
    process's name in the history (its pid, as the soak's runs name it)."""

    def __init__(self, path: str | os.PathLike[str], runner: str | None = None) -> None:
        super().__init__(logging.DEBUG)
        self.path = Path(path)
        self.runner = runner or str(os.getpid())

    def emit(self, record: logging.LogRecord) -> None:
        event = lease_event(record, now_ms(), lambda _: self.runner)
        if event is None:
            return
        with open(self.path, "a") as lines:
            lines.write(json.dumps(asdict(event)) + "\n")


def install_lines(path: str | os.PathLike[str]) -> None:
    """In a subscriber process (its settings): append its lease events to ``path``."""
    logger = logging.getLogger(LOGGER)
    logger.addHandler(LeaseLines(path))
    logger.setLevel(logging.DEBUG)


def read_lines(paths: Iterable[Path], history: History) -> int:
    """Record the lease events in ``paths`` (``LeaseLines`` files) in ``history``, in
    time order; a line cut short by a kill is skipped. Returns how many were read."""
    read: list[LeaseEvent] = []
    for path in paths:
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, TypeError):
                read.append(LeaseEvent(**json.loads(line)))
    for event in sorted(read, key=lambda e: e.at_ms):
        history.leased(event)
    return len(read)


@contextlib.contextmanager
def _attached(handler: logging.Handler) -> Iterator[None]:
    logger = logging.getLogger(LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
