"""Limits of one consumer: ``rate_limit`` and ``max_in_flight`` (docs/guides/consuming.md,
"Limits: protecting a slow downstream"). No I/O here.

Both limits hold for the whole consumer group, across its ``runconsumer`` processes,
without any extra coordination: each process takes its share and stays within it.

* ``rate_limit`` (messages per second) is shared by lease share: a process holding ``h``
  of the topic's ``P`` partitions may start ``rate_limit * h / P`` messages a second (a
  token bucket). Leases are exclusive, so the shares add up to the limit at most; with
  messages spread over the partitions, each process has work in proportion to its share.
* ``max_in_flight`` is shared by live subscriber count: of ``S`` live subscribers sorted
  by name, each may have ``max_in_flight // S`` deliveries outstanding, the first
  ``max_in_flight % S`` one more, so that the shares add up to the limit exactly.

A message held back by a limit stays where it is: it is not marked delivered, so no
attempt is charged and its visibility timeout does not start.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sqlqueue.consuming.clock import SYSTEM_CLOCK

#: The bucket holds at most this many seconds' worth of tokens (and at least two): enough
#: to absorb a late wake-up of the loop, small enough that a burst after an idle spell
#: stays a few percent of a ten-second measurement.
BURST_SECONDS = 0.2


def member_share(total: int, members: list[str], me: str) -> int:
    """``me``'s part of ``total`` among ``members``: ``total // S``, plus one for the first
    ``total % S`` members by name, so that the parts add up to ``total`` exactly. Not yet
    seen alive (before its first heartbeat is read), ``me`` counts itself in last."""
    everyone = sorted(set(members) | {me})
    count = len(everyone)
    rank = everyone.index(me)
    return total // count + (1 if rank < total % count else 0)


class TokenBucket:
    """At most ``rate`` starts a second, on the monotonic clock."""

    def __init__(self, rate: float, now: Callable[[], float] | None = None) -> None:
        self._now = now = now or SYSTEM_CLOCK.monotonic
        self.rate = rate
        self.capacity = self._capacity(rate)
        self.tokens = min(1.0, self.capacity)  # the first message need not wait
        self._updated = now()

    @staticmethod
    def _capacity(rate: float) -> float:
        return max(2.0, rate * BURST_SECONDS)

    def set_rate(self, rate: float) -> None:
        """A new share (leases changed hands): tokens saved so far are kept, up to the
        new capacity."""
        if rate != self.rate:
            self._refill()
            self.rate = rate
            self.capacity = self._capacity(rate)
            self.tokens = min(self.tokens, self.capacity)

    def available(self) -> int:
        self._refill()
        return math.floor(self.tokens)

    def spend(self, count: int) -> None:
        self._refill()
        self.tokens -= count

    def wait(self) -> float | None:
        """Seconds until one whole token is there (None: never, at a rate of zero)."""
        self._refill()
        if self.tokens >= 1:
            return 0.0
        if self.rate <= 0:
            return None
        return (1 - self.tokens) / self.rate

    def _refill(self) -> None:
        now = self._now()
        self.tokens = min(self.capacity, self.tokens + (now - self._updated) * self.rate)
        self._updated = now


class Limits:
    """The limits of one consumer in one process."""

    def __init__(self, rate_limit: float | None, max_in_flight: int | None, *,
                 warm_up: float, now: Callable[[], float] | None = None) -> None:
        now = now or SYSTEM_CLOCK.monotonic  # the Subscriber passes its host clock's
        self.rate_limit = rate_limit
        self.max_in_flight = max_in_flight
        self.bucket = TokenBucket(0.0, now) if rate_limit is not None else None
        # A process that joins a running group starts nothing under max_in_flight for
        # this long (a lease renew interval): by then every other member has read the
        # heartbeats at a lease tick and lowered its own share to make room.
        self.warm_up = warm_up
        self._now = now
        self._joined_at: float | None = None

    def share_leases(self, held: int, partitions: int) -> None:
        """Set the rate share from the leases held (of ``partitions`` in the topic)."""
        if self.bucket is not None and self.rate_limit is not None:
            self.bucket.set_rate(self.rate_limit * held / partitions if partitions else 0.0)

    def in_flight_share(self, members: list[str], me: str) -> int | None:
        """How many deliveries this process may have outstanding (None: no limit)."""
        if self.max_in_flight is None:
            return None
        if me in members and self._joined_at is None:
            alone = members == [me]
            self._joined_at = self._now() - (self.warm_up if alone else 0.0)
        if self._joined_at is None or self._now() - self._joined_at < self.warm_up:
            return 0
        return member_share(self.max_in_flight, members, me)

    def allowance(self, in_flight: int, members: list[str], me: str) -> int | None:
        """How many more messages may start now (None: no limit applies)."""
        allowed: int | None = None
        share = self.in_flight_share(members, me)
        if share is not None:
            allowed = max(0, share - in_flight)
        if self.bucket is not None:
            tokens = max(0, self.bucket.available())
            allowed = tokens if allowed is None else min(allowed, tokens)
        return allowed

    def spend(self, count: int) -> None:
        if self.bucket is not None and count:
            self.bucket.spend(count)

    def rate_wait(self) -> float | None:
        """Seconds until the rate limit lets the next message start (None: no rate
        limit, or a share of zero: nothing to wait for here)."""
        return None if self.bucket is None else self.bucket.wait()
