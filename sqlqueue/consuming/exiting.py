"""A graceful exit's last watermark moves: over every row the process acked, as far as
the write horizon lets them go (docs/reference/guarantees.md, below the table). ``Runner`` owns one
``ExitSettler``; runs on the runner's main thread at its shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction

from sqlqueue import storage
from sqlqueue.consuming.clock import SYSTEM_CLOCK, Clock, HostClock
from sqlqueue.consuming.settling import HorizonWatch
from sqlqueue.consuming.subscriber import Subscriber
from sqlqueue.storage.sql.sessions import OpenWriter

logger = logging.getLogger("sqlqueue.consumer")

#: At a graceful exit, how long the runner waits for the write horizon to pass the rows
#: it acked last (MySQL's lags the clock by up to two seconds, in whole seconds), and how
#: often it looks.
EXIT_SETTLE_SECONDS = 3.0
EXIT_SETTLE_STEP = 0.5


class ExitSettler:
    """Moves a stopping runner's watermarks over its last acks."""

    def __init__(self, *, alias: str, horizon: HorizonWatch, clock: Clock,
                 settle_seconds: float, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.alias = alias
        self.horizon = horizon
        self.clock = clock
        self.settle_seconds = settle_seconds
        #: after ``advance``: the subscriptions whose watermark stayed behind their acks,
        #: and the other session's write transaction the horizon waited for, if seen
        self.behind: list[str] = []
        self.held_by: OpenWriter | None = None

    def advance(self, cursor: Any, subscribers: Sequence[Subscriber], name: str) -> None:
        """Move every watermark over what this process acked before it hands its
        partitions over. Rows inserted in the last moments are not settled yet where the
        write horizon trails the clock (MySQL's INNODB_TRX: a second or two): the horizon
        is read again until it passes them, for up to ``settle_seconds``. Where it cannot
        (a publisher's transaction still open, or no view of open transactions:
        MAX_TRANSACTION_AGE), the rest is left for the partitions' next holder, as the
        late-commit rule requires (guarantee I4)."""
        deadline = self.host_clock.monotonic() + self.settle_seconds
        waiting = list(subscribers)
        while True:
            for subscriber in waiting:
                with transaction.atomic(using=self.alias):
                    subscriber.fence(cursor)
                    settled = self.horizon.settled_before(cursor, self.clock.now_ms())
                    subscriber.watermarks.advance(cursor, settled, force=True)
            waiting = [s for s in waiting if s.done_above_watermarks()]
            if not waiting or self.host_clock.monotonic() >= deadline:
                break
            self.horizon.expire()
            self.host_clock.sleep(EXIT_SETTLE_STEP)
        self.behind = [s.consumer.name for s in waiting]
        if waiting:
            self.held_by = self._oldest_writer(cursor)
            logger.info("%s: exiting with acks above the watermark of %s (their rows are not "
                        "settled yet: a publishing transaction may still be open%s); the "
                        "partitions' next holder moves it over them.", name,
                        ", ".join(self.behind), "" if self.held_by is None else
                        f": the write horizon waits for {self.held_by.describe()}")

    def _oldest_writer(self, cursor: Any) -> OpenWriter | None:
        """Which transaction holds the horizon back (None: none seen, or not readable)."""
        try:
            return storage.store(connections[self.alias]).oldest_writer(cursor)
        except DatabaseError:
            return None
