"""A watch on the log's offset counter: it only grows, so a reading lower than an earlier
one means the database lost writes (a failover to a replica that was behind, a restore
from a backup). Offsets are then handed out again: whatever keyed on them outside the
database (a handler's side effects keyed by ``message.offset``, a Spark stream's
checkpoint) may now name another message. Logged as an ERROR for people to act on; the
consumers themselves already start afresh when the server changes (server identity)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import Error as AnyDatabaseError
from django.db import connections

from sqlqueue import events, storage

logger = logging.getLogger("sqlqueue.consumer")

#: How often the counter is read (one statement, milliseconds of the database clock).
CHECK_INTERVAL_MS = 60_000


class OffsetCounterWatch:
    """A runner timer (``Pacer.timers``) that reads the counter once a minute."""

    def __init__(self, alias: str, now_ms: Callable[[], int],
                 interval_ms: int = CHECK_INTERVAL_MS) -> None:
        self.alias = alias
        self._now_ms = now_ms
        self.interval_ms = interval_ms
        self._next_ms = 0
        self.seen: int | None = None

    def next_due_ms(self) -> int | None:
        return self._next_ms

    def run_due(self) -> None:
        now = self._now_ms()
        if now < self._next_ms:
            return
        self._next_ms = now + self.interval_ms
        connection = connections[self.alias]
        try:
            with connection.cursor() as cursor:
                counter = storage.store(connection).offset_counter(cursor)
        except AnyDatabaseError as exc:  # the consumer loop reconnects; try next time
            logger.debug("Could not read the offset counter: %s", exc)
            return
        if counter is None:
            return
        if self.seen is not None and counter < self.seen:
            logger.error(
                "The log's offset counter went back from %d to %d on %s: the database lost "
                "writes (a failover to a replica that was behind, or a restore). Offsets "
                "above %d are handed out again: anything that keyed on them outside the "
                "database may now name another message.", self.seen, counter, self.alias,
                counter,
                extra=events.fields(events.OFFSET_COUNTER_WENT_BACK, seen=self.seen,
                                    now=counter, database=self.alias))
        self.seen = counter
