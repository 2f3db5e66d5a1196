"""No log write while a runner's transaction holds its lease rows.

A log write can block: standard error piped to a process that stopped reading (a full
pipe), a stalled log collector, a paused terminal. Inside a cycle transaction that means
share locks on the runner's lease rows held for as long as it blocks, and the other
runners unable to take its partitions over (the wave-4 rerun saw 12 minutes on MariaDB).
So what the runner's main thread logs inside such a transaction waits, and is written
once the transaction has ended (committed or rolled back). The server's bound on idle
transactions (``ServerWatch``) covers what this cannot: a process frozen whole.

And a flood of failures is one line per subscription and kind per interval (``FailureLog``):
a bad deploy or a downstream outage fails every message of a group at once, and a line per
message would bury everything else in the log (100,000 failures, 100,000 lines). The
``OutcomeRecorder`` tells a ``FailureLog`` of each handler failure and each dead letter,
and it writes the first one of an interval at once, as one line with its detail (a lone
failure reads as it always did), then, once ``FAILURE_LOG_INTERVAL_SECONDS`` have passed,
one line with how many more there were and the latest of them. Every failure's own detail
stays at DEBUG (``sqlqueue.handler.failed``, ``sqlqueue.message.dead_lettered``) and, for
a dead letter, in the dead letter itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import transaction

from sqlqueue import events

_consumer_log = logging.getLogger("sqlqueue.consumer")

#: the loggers of what runs inside a runner's cycle transaction
HELD_LOGGERS = ("sqlqueue.consumer", "sqlqueue.leases")
#: ...looked up once: ``getLogger`` takes the logging module's lock (twice a pass, every pass)
_HELD = tuple(logging.getLogger(name) for name in HELD_LOGGERS)


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
        loggers = _HELD
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


#: at most one line per subscription and kind (handler failures, dead letters) this often
FAILURE_LOG_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True)
class Failure:
    """One failed run or one dead letter, as its line tells it."""

    partition: str
    offset: int
    attempt: int
    text: str  # what the handler raised (a failure), or why (a dead letter: "rejected"...)
    subject: str  # what the message asked, in its handler's words ("" for none)


@dataclass(frozen=True)
class FailureKind:
    """Which lines a ``FailureLog`` writes: their event, level and words."""

    event: str
    level: int
    #: (handler name, topic, group, failure) -> the line of one failure
    one: Callable[[str, str, str, Failure], str]
    #: (handler name, topic, group, count, seconds, latest) -> the line of many
    many: Callable[[str, str, str, int, float, Failure], str]


def _subject(failure: Failure, before: str) -> str:
    return f"{before}{failure.subject}" if failure.subject else ""


HANDLER_FAILURE_LINES = FailureKind(
    events.HANDLER_FAILURES, logging.WARNING,
    lambda name, topic, group, f: (
        f"Handler {name} failed on {topic}/{f.partition}@{f.offset} (attempt {f.attempt})"
        f"{_subject(f, ', ')}: {f.text}"),
    lambda name, topic, group, count, seconds, f: (
        f"Handler {name} failed {count} times in the last {seconds:.0f}s; the latest on "
        f"{topic}/{f.partition}@{f.offset} (attempt {f.attempt}){_subject(f, ', ')}: "
        f"{f.text}"),
)

DEAD_LETTER_LINES = FailureKind(
    events.DEAD_LETTERS, logging.ERROR,
    lambda name, topic, group, f: (
        f"Dead-lettered {topic}/{f.partition}@{f.offset}{_subject(f, ' (') + ')' * bool(f.subject)}"
        f" for group {group!r} after {f.attempt} attempt(s) ({f.text})."),
    lambda name, topic, group, count, seconds, f: (
        f"Dead-lettered {count} messages of {topic} for group {group!r} in the last "
        f"{seconds:.0f}s; the latest {topic}/{f.partition}@{f.offset}"
        f"{_subject(f, ' (') + ')' * bool(f.subject)} after {f.attempt} attempt(s) "
        f"({f.text})."),
)


class FailureLog:
    """One subscription's lines of one kind. ``monotonic``: this host's clock (seconds)."""

    def __init__(self, kind: FailureKind, *, name: str, group: str, topic: str,
                 monotonic: Callable[[], float],
                 interval: float = FAILURE_LOG_INTERVAL_SECONDS) -> None:
        self.kind = kind
        self.name, self.group, self.topic = name, group, topic
        self.monotonic = monotonic
        self.interval = interval
        self._opened: float | None = None  # when the last line was written
        self._count = 0  # failures since, not yet in a line
        self._latest: Failure | None = None
        self._kinds: set[str] = set()  # the kinds of error told this interval

    def note(self, failure: Failure) -> None:
        """One more failure: written now if no line was this interval, or if it is the
        first of its kind this interval (a flood of one error must not hide another: a
        ``DeliveredByAnotherServer`` beside the lost connections of a failover), else
        counted."""
        kind = _kind_of(failure)
        now = self.monotonic()
        if self._opened is not None and now - self._opened < self.interval \
                and kind not in self._kinds:
            self._kinds.add(kind)
            self._tell(1, 0.0, failure)
            return
        self._count += 1
        self._latest = failure
        if self._opened is None or now - self._opened >= self.interval:
            self._write(now)

    def flush(self) -> None:
        """Write what was counted, once its interval has passed (each pass asks)."""
        if self._count and self._opened is not None:
            now = self.monotonic()
            if now - self._opened >= self.interval:
                self._write(now)

    def _write(self, now: float) -> None:
        latest, count = self._latest, self._count
        assert latest is not None
        self._tell(count, now - self._opened if self._opened is not None else 0.0, latest)
        self._opened, self._count, self._latest = now, 0, None
        self._kinds = {_kind_of(latest)}

    def _tell(self, count: int, seconds: float, latest: Failure) -> None:
        if count == 1:
            text = self.kind.one(self.name, self.topic, self.group, latest)
        else:
            text = self.kind.many(self.name, self.topic, self.group, count, seconds, latest)
        _consumer_log.log(self.kind.level, "%s", text, extra=events.fields(
            self.kind.event, group=self.group, topic=self.topic, count=count,
            partition=latest.partition, offset=latest.offset, attempt=latest.attempt,
            error=latest.text, subject=latest.subject))


def _kind_of(failure: Failure) -> str:
    """What kind of error a failure is: its exception's name (``"ValueError: ..."``), or
    a dead letter's reason (``"rejected"``)."""
    return failure.text.split(":", 1)[0]
