"""A subscription's deliveries between hand-out and outcome: the ``Deliveries`` ledger.

What the pool was handed and has not answered for yet (``outstanding``), and the timed-out
deliveries whose handler thread still runs (``stuck``: still in flight for the limits).
Its ``Subscriber`` owns one; the HandlerPool's timeout check asks it (``running``,
``timed_out``, ``still_stuck``) instead of reading a subscriber's dict. And what the
answers said of each partition lately: ``FailingPartitions`` (its runs all fail: a flood,
whose deliveries yield to the healthy ones, sqlqueue.consuming.fairness).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlqueue.consuming.handlers import Delivery, Outcome

#: Runs in a row that failed before a partition counts as failing.
FAILING_AFTER = 3
#: What a handler's run came to, for the count: succeeded, or failed (given back: neither).
SUCCEEDED_RUNS = frozenset({"ack", "acked"})
FAILED_RUNS = frozenset({"fail", "retry", "reject"})


class Deliveries:
    """One subscription's deliveries in flight, on the runner's main thread."""

    def __init__(self) -> None:
        self.outstanding: dict[int, Delivery] = {}  # handed to the pool, no outcome yet
        self.stuck: list[Delivery] = []  # timed out, handler still running: in flight

    def __bool__(self) -> bool:
        return bool(self.outstanding)

    def handed_out(self, deliveries: Iterable[Delivery]) -> int:
        """The transaction that marked ``deliveries`` committed: they are the handlers'.
        Returns how many."""
        count = 0
        for delivery in deliveries:
            self.outstanding[id(delivery)] = delivery
            count += 1
        return count

    def answered(self, outcomes: Iterable[Outcome]) -> None:
        """The transaction that wrote ``outcomes`` committed: no longer outstanding."""
        for outcome in outcomes:
            self.outstanding.pop(id(outcome.delivery), None)

    def running(self) -> list[Delivery]:
        """The outstanding deliveries (a copy: the timeout check changes them)."""
        return list(self.outstanding.values())

    def take_back(self, partitions: set[str]) -> list[Delivery]:
        """The queued (not started) deliveries of ``partitions``, taken back from the pool
        (``Delivery.give_back``): no handler will start them."""
        return [d for d in self.outstanding.values()
                if d.partition_key in partitions and d.give_back()]

    def timed_out(self, delivery: Delivery) -> None:  # its handler thread still runs
        self.stuck.append(delivery)

    def still_stuck(self) -> list[Delivery]:
        self.stuck = [d for d in self.stuck if d.running]  # forget returned ones
        return self.stuck

    def in_flight(self) -> int:
        """Deliveries outstanding, and timed-out handlers still running."""
        return len(self.outstanding) + sum(1 for d in self.still_stuck()
                                           if id(d) not in self.outstanding)

    def forget(self) -> None:
        """Another server: no outcome of these will be written."""
        self.outstanding.clear()


class FailingPartitions:
    """One subscription's failed runs in a row, by partition (the runner's main thread
    writes it: the OutcomeRecorder, once the outcomes are committed; the Fetcher reads
    it when it hands deliveries out)."""

    def __init__(self) -> None:
        self._streaks: dict[str, int] = {}

    def ran(self, outcomes: Iterable[Outcome]) -> None:
        """Count the runs that ``outcomes`` ended, in their order."""
        for outcome in outcomes:
            key = outcome.delivery.partition_key
            if outcome.kind in SUCCEEDED_RUNS:
                self._streaks.pop(key, None)
            elif outcome.kind in FAILED_RUNS:
                self._streaks[key] = self._streaks.get(key, 0) + 1

    def failing(self, partition_key: str) -> bool:
        return self._streaks.get(partition_key, 0) >= FAILING_AFTER

    def keep_only(self, partition_keys: Iterable[str]) -> None:
        """Forget the partitions no longer held (a new tenure starts counting afresh)."""
        held = set(partition_keys)
        self._streaks = {k: n for k, n in self._streaks.items() if k in held}
