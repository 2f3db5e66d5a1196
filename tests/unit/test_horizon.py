"""The write horizon rule (sqlqueue.horizon) and how the consumer engine applies it: which
rows are settled, from a snapshot of the open transactions that may be stale (guarantee I4)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import DatabaseError

from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.runner import Runner
from sqlqueue.horizon import (
    MARGIN_MS,
    REFRESH,
    UNKNOWN,
    WriteHorizon,
    refresh_delay,
    settled_before,
)

NOW = 1_000_000_000  # epoch ms, the database clock
AGE = 300_000  # MAX_TRANSACTION_AGE
FLOOR = NOW - AGE


def test_a_fresh_snapshot_without_writers_settles_up_to_our_own_start() -> None:
    # Our own transaction (started 400 ms ago, listed in whole seconds) is the newest.
    assert settled_before(WriteHorizon(None, NOW - 400), NOW, AGE) == NOW - 400 - MARGIN_MS


def test_an_open_writer_holds_the_horizon_back() -> None:
    seen = WriteHorizon(NOW - 20_000, NOW - 400)
    assert settled_before(seen, NOW, AGE) == NOW - 20_000 - MARGIN_MS


def test_a_stale_snapshot_settles_only_up_to_the_newest_transaction_it_lists() -> None:
    """A snapshot taken 30 s ago misses every writer that began since: its newest listed
    transaction (not our own, which began after it) bounds what it can vouch for."""
    stale = WriteHorizon(None, NOW - 30_000)
    assert settled_before(stale, NOW, AGE) == NOW - 30_000 - MARGIN_MS


def test_a_stale_snapshot_keeps_a_later_previous_horizon() -> None:
    stale = WriteHorizon(None, NOW - 30_000)
    previous = NOW - 5_000  # from a fresh snapshot a moment ago: still settled
    assert settled_before(stale, NOW, AGE, previous) == previous
    # ... but an older previous horizon does not hold a fresher one back.
    assert settled_before(stale, NOW, AGE, NOW - 60_000) == NOW - 30_000 - MARGIN_MS
    fresh = WriteHorizon(NOW - 10_000, NOW)
    assert settled_before(fresh, NOW, AGE, NOW - 60_000) == NOW - 10_000 - MARGIN_MS


def test_a_snapshot_that_lists_nothing_says_nothing() -> None:
    """Not even our own transaction: the snapshot may be any age (or ours not started)."""
    assert settled_before(WriteHorizon(None, None), NOW, AGE) == FLOOR
    assert settled_before(WriteHorizon(None, None), NOW, AGE, NOW - 5_000) == NOW - 5_000


def test_without_the_process_privilege_the_longest_transaction_is_assumed() -> None:
    assert settled_before(UNKNOWN, NOW, AGE) == FLOOR
    assert settled_before(UNKNOWN, NOW, AGE, FLOOR - 1) == FLOOR


def test_a_writer_older_than_max_transaction_age_is_not_waited_for() -> None:
    seen = WriteHorizon(NOW - 2 * AGE, NOW)
    assert settled_before(seen, NOW, AGE) == FLOOR


def test_start_times_ahead_of_the_clock_count_as_now() -> None:
    # trx_started comes from the server's wall clock, created_at from UTC_TIMESTAMP(6):
    # a step of the clock must not put the horizon in the future.
    assert settled_before(WriteHorizon(None, NOW + 60_000), NOW, AGE) == NOW - MARGIN_MS


def test_reads_are_spread_out_but_never_more_often_than_refresh() -> None:
    delays = [refresh_delay() for _ in range(200)]
    assert all(REFRESH <= d <= 1.5 * REFRESH for d in delays)
    assert max(delays) - min(delays) > REFRESH / 4  # jitter: processes drift apart


# -- the consumer engine's use of it ------------------------------------------------------------

class FakeStore:
    """What ``HorizonWatch._read`` needs of a store: ``write_horizon``."""

    def __init__(self, *seen: WriteHorizon | Exception | None) -> None:
        self.seen = list(seen)

    def write_horizon(self, cursor: Any) -> WriteHorizon | None:
        answer = self.seen.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Any:
    def with_store(*seen: WriteHorizon | Exception | None) -> Runner:
        store = FakeStore(*seen)
        monkeypatch.setattr("sqlqueue.storage.store", lambda using: store)
        return Runner([], conf=QueueSettings(MAX_TRANSACTION_AGE=AGE / 1000))

    return with_store


def horizon_now(runner: Runner) -> int | None:
    runner.horizon._cache.expires = 0.0  # due for a read
    return runner.horizon.settled_before(None, NOW)


def test_the_runner_keeps_its_last_horizon_through_stale_snapshots(runner: Any) -> None:
    r = runner(WriteHorizon(None, NOW - 1_000), WriteHorizon(None, NOW - 30_000),
               WriteHorizon(None, None), WriteHorizon(NOW - 3_000, NOW))
    fresh = NOW - 1_000 - MARGIN_MS
    assert horizon_now(r) == fresh
    assert horizon_now(r) == fresh  # stale: lists only transactions from 30 s ago
    assert horizon_now(r) == fresh  # lists nothing at all
    assert horizon_now(r) == fresh  # a writer that began 3 s ago: not passed, not undone


def test_the_runner_reuses_a_horizon_until_its_refresh_is_due(runner: Any) -> None:
    r = runner(WriteHorizon(None, NOW))
    before = time.monotonic()
    assert {r.horizon.settled_before(None, NOW) for _ in range(20)} == {NOW - MARGIN_MS}  # one read
    after = time.monotonic()
    # The read came between the two readings of the clock, so this holds however long the
    # reads took: the next is due a refresh delay (REFRESH to 1.5 REFRESH) after it.
    assert before + REFRESH <= r.horizon._cache.expires <= after + 1.5 * REFRESH


def test_the_runner_without_the_process_privilege(runner: Any) -> None:
    r = runner(DatabaseError("Access denied; you need the PROCESS privilege"))
    assert horizon_now(r) == FLOOR


def test_the_runner_on_sqlite_settles_every_visible_row(runner: Any) -> None:
    assert horizon_now(runner(None)) is None


def test_the_settled_cache_reads_when_due_with_the_last_value_as_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    from sqlqueue import horizon as horizon_module

    cache = horizon_module.SettledCache()
    floors: list[int | None] = []

    def read(previous: int | None) -> int:
        floors.append(previous)
        return len(floors) * 10

    assert [cache.get(read) for _ in range(3)] == [10, 10, 10]  # one read, then kept
    monkeypatch.setattr(horizon_module, "refresh_delay", lambda: 0.0)
    cache.expires = 0.0
    assert cache.get(read) == 20 and cache.get(read) == 30
    assert floors == [None, 10, 20]  # each read gets the last value as its floor
    cache.forget()
    assert cache.get(read) == 40 and floors[-1] is None  # another server: no floor
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.value, copy.expires) == (40, 0.0)  # due at once where it lands
