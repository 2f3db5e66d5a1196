"""The write horizon rule, without Django: the consumer engine and the Spark executors,
which must not import Django, share it.

Offsets come from AUTO_INCREMENT when a row is inserted, but the row becomes visible when
its transaction commits, so a row can appear *below* offsets already visible (guarantee I4). A
row is *settled* once no transaction that could still commit a row below it is open:
rows inserted (``created_at``, the database clock) before the horizon are settled.

PostgreSQL shows every open transaction exactly (``pg_stat_activity``); the bound is
proven in sqlqueue.storage.sql.postgresql, ``write_horizon``.

MySQL and MariaDB show open transactions in ``information_schema.INNODB_TRX``. That table
is a server-wide snapshot that InnoDB refreshes only when nobody has read it for 0.1 s, so
with enough readers it can stay stale for any length of time, and a transaction that
began after it was taken is missing from it. A snapshot cannot say when it was taken, but
every transaction it lists had started by then: so the horizon is the start of the oldest
listed writer or of the newest listed transaction, whichever is earlier, minus a margin.
Readers read it inside a started transaction of their own, so that a fresh snapshot lists
at least that one, and a stale snapshot yields an older, still safe, horizon.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

#: ``trx_started`` has whole seconds, truncated (which only makes the horizon earlier).
#: The margin covers the time between the start of an INSERT, which gives ``created_at``,
#: and the moment InnoDB lists its transaction as a writer (parsing, opening tables), and
#: the time InnoDB takes to fill a snapshot.
MARGIN_MS = 1000
#: Seconds between reads of INNODB_TRX by one process (plus jitter, ``refresh_delay``):
#: every read postpones InnoDB's next refresh of the snapshot by 0.1 s for every reader.
REFRESH = 0.5


class WriteHorizon(NamedTuple):
    """What a snapshot of the open transactions says (epoch ms, whole seconds)."""

    #: start of the oldest open transaction that has written rows (None: none listed)
    oldest_writer_ms: int | None
    #: start of the newest transaction listed: the snapshot was taken after it (None:
    #: nothing listed, not even the reader's own transaction, so the snapshot's age is
    #: unknown)
    newest_start_ms: int | None
    #: subtracted from the earlier of the two: what the snapshot may miss (MySQL); 0
    #: where the database's view of open transactions is exact (PostgreSQL)
    margin_ms: int = MARGIN_MS


#: Nothing known about open transactions (INNODB_TRX unreadable: no PROCESS privilege;
#: or not telling: on a Galera node it lists that node's transactions only, and a
#: transaction open on another node would commit below a watermark that passed it).
UNKNOWN = WriteHorizon(None, None)


def settled_before(seen: WriteHorizon, now_ms: int, max_transaction_age_ms: int,
                   previous_ms: int | None = None) -> int:
    """Database time before which every inserted row is settled.

    The snapshot was taken after its newest listed transaction began: a writer it misses
    began later, or had written nothing yet, so the rows it inserts are newer than that.
    ``previous_ms`` is an earlier result: what was settled then still is. No transaction
    is assumed to stay open longer than ``max_transaction_age_ms``.
    """
    horizon = now_ms - max_transaction_age_ms
    if previous_ms is not None:
        horizon = max(horizon, previous_ms)
    if seen.newest_start_ms is not None:
        started = min(seen.newest_start_ms, now_ms)
        if seen.oldest_writer_ms is not None:
            started = min(started, seen.oldest_writer_ms)
        horizon = max(horizon, started - seen.margin_ms)
    return horizon


def refresh_delay() -> float:
    """Seconds until a process reads INNODB_TRX again: ``REFRESH`` and up to half as much
    again, at random, so that many processes do not read in step."""
    return REFRESH * random.uniform(1.0, 1.5)


class SettledCache:
    """A process's last ``settled_before``, read again at most every ``refresh_delay()``
    seconds and kept meanwhile: what was settled then still is, so the last value is
    safe to reuse and is the floor of the next read. The consumer engine and the Spark
    stream each keep one."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic  # the engine passes its host clock's
        self.value: int | None = None
        self.expires = 0.0  # monotonic() of the next read

    def get(self, read: Callable[[int | None], int | None]) -> int | None:
        """The kept value, or, when a read is due, ``read(the kept value)``'s."""
        if self._monotonic() >= self.expires:
            self.value = read(self.value)
            self.expires = self._monotonic() + refresh_delay()
        return self.value

    def expire(self) -> None:
        """Read again at the next use, the kept value still its floor."""
        self.expires = 0.0

    def forget(self) -> None:
        """Read afresh at the next use, without a floor (a horizon read on another
        server says nothing about this one)."""
        self.value, self.expires = None, 0.0

    def __getstate__(self) -> dict[str, Any]:
        # Pickled along with a Spark stream reader: read afresh where it lands.
        return {"value": self.value, "expires": 0.0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A monotonic clock means nothing in another process: where it lands, its own.
        self._monotonic = time.monotonic
        self.value, self.expires = state["value"], state["expires"]
