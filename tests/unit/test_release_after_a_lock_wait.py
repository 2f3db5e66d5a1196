"""A partition whose outcome waits to be written is not handed over (found by the soak,
issue 51): a lock wait that gives up resets the subscriber's view of its partitions, and
the outcomes are kept for the next pass; were the partition released meanwhile (a
newcomer's share), the outcome could no longer be written as the owner's, and a handler
that had finished well would run again (SPEC section 10, I5/I10)."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from tests.engine.harness import ALIASES
from tests.engine.memory.store import MemoryStore
from tests.unit.test_engine_on_memory import (  # noqa: F401 (fixtures)
    Seen,
    _consumers,
    publish,
    queue,
    recorder,
    registered,
    steps,
)


class LockWaitGaveUp(DatabaseError):
    pass


def test_a_partition_is_not_released_while_its_outcome_waits_to_be_written(
        queue, registered, monkeypatch) -> None:  # noqa: F811 (the fixtures)
    seen: Seen = []
    registered("g", recorder(queue, seen))
    publish({f"p{n}": [f"m{n}"] for n in range(4)})
    first = queue.runner(_consumers("g"), alias=ALIASES[0], name="first")
    steps(queue, [first], 20)  # first holds the four partitions
    publish({"p3": ["late"]})
    first.run_once()
    assert first.pool.run_handed_out() == 1  # late's handler finished well
    write_outcomes, failing = MemoryStore.write_outcomes, [True]

    def gives_up_once(self: MemoryStore, *args: Any) -> None:
        if failing:
            failing.pop()
            raise LockWaitGaveUp("lock wait timeout (another program's transaction)")
        write_outcomes(self, *args)

    monkeypatch.setattr(MemoryStore, "write_outcomes", gives_up_once)
    monkeypatch.setattr(MemoryStore, "is_lock_wait",
                        lambda self, error: isinstance(error, LockWaitGaveUp))
    second = queue.runner(_consumers("g"), alias=ALIASES[1], name="second")
    second.run_once()  # a newcomer: first's share is two partitions now, p2 and p3 go
    first.run_once()  # the write gives up: late's outcome is kept, the view reset
    assert not failing
    steps(queue, [first, second], 60, every_ms=100)
    assert [(i, a) for _, i, a, _ in seen if i == "late"] == [("late", 1)]
    holders = {key[2]: lease.leased_by for key, lease in queue.tables.leases.items()
               if key[0] == "g"}
    assert holders == {"p0": "first", "p1": "first", "p2": "second", "p3": "second"}
