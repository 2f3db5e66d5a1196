"""Pure pieces of the consumer engine: backoff, the partition bookkeeping, the registry."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from sqlqueue import ConfigurationError, Message, Retry
from sqlqueue.consuming.backoff import JITTER, retry_delay
from sqlqueue.consuming.leases import (
    FREE_LEASE_RECHECK,
    MEMBERSHIP_RECHECK,
    LeaseKeeper,
    fair_share,
)
from sqlqueue.consuming.outcomes import dead_letter_id
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from sqlqueue.storage.sql.base import FetchedRow
from tests.manual_clock import ManualSeconds


def row(offset: int, **overrides: Any) -> FetchedRow:
    values: dict[str, Any] = dict(
        offset=offset, id=f"m{offset}", payload=b"{}", metadata=None, created_at=1000,
        published_at=1000, priority=50, deliver_after=0, consumer_group="",
        failure_detail=None, acked=None, invisible_until=None, retry_count=None,
    )
    values.update(overrides)
    return FetchedRow(**values)


# -- backoff (I9) ------------------------------------------------------------------------------

def test_backoff_doubles_from_min_and_stops_at_max() -> None:
    no_jitter = random.Random()
    no_jitter.random = lambda: 0.0  # type: ignore[method-assign]
    delays = [retry_delay(n, 1, 30, no_jitter) for n in range(1, 8)]
    assert delays == [1, 2, 4, 8, 16, 30, 30]


def test_backoff_jitter_is_up_to_a_third_and_spreads_retries() -> None:
    rng = random.Random(7)
    delays = [retry_delay(3, 1, 3600, rng) for _ in range(1000)]
    assert all(4 <= d <= 4 * (1 + JITTER) for d in delays)
    assert len({round(d, 4) for d in delays}) > 900  # no thundering herd


def test_backoff_survives_huge_attempt_numbers() -> None:
    assert retry_delay(10_000, 1, 60, random.Random(1)) <= 60 * (1 + JITTER)
    with pytest.raises(ValueError):
        retry_delay(0, 1, 60)


# -- partition bookkeeping ----------------------------------------------------------------

def test_unordered_ready_orders_by_priority_and_caps_in_flight() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1, priority=50), row(2, priority=0), row(3, priority=10)], "g")
    ready = state.ready(now_ms=5000, batch_size=2, ordered=False)
    assert [e.offset for e in ready] == [2, 3]
    for entry in ready:
        state.dispatched(entry)
    assert state.ready(5000, 2, False) == []  # two in flight: the cap


def test_ordered_ready_is_the_head_only() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1), row(2)], "g")
    (head,) = state.ready(5000, 10, ordered=True)
    assert head.offset == 1
    state.dispatched(head)
    assert state.ready(5000, 10, ordered=True) == []
    state.retry_at(1, due_ms=9000)
    assert state.ready(5000, 10, ordered=True) == []  # backing off holds the partition
    assert [e.offset for e in state.ready(9000, 10, ordered=True)] == [1]


def test_a_late_ack_of_an_overtaken_attempt_holds_the_ordered_partition_while_the_redelivery_runs(
) -> None:
    """Attempt 1 outlives its visibility timeout, attempt 2 is delivered and runs; then
    attempt 1 answers "ack": the message is done, but attempt 2 still runs, and the next
    message must not start beside it (I5; found by the history checker on MariaDB)."""
    state = PartitionState("k", watermark=0)
    state.absorb([row(1), row(2)], "g")
    (first,) = state.ready(5000, 10, ordered=True)
    state.dispatched(first, visible_again_ms=6000)
    (again,) = state.ready(6000, 10, ordered=True)  # past its timeout: delivered again
    assert again is first
    state.dispatched(again, visible_again_ms=7000)
    state.finished(1, attempt=1)  # attempt 1's late ack
    assert first.done
    assert state.ready(6500, 10, ordered=True) == []  # attempt 2 still runs
    state.entries.pop(1)  # the watermark passed it: the hold does not need the entry
    assert state.ready(6500, 10, ordered=True) == []
    state.run_ended(1, attempt=1)  # the late ack's own run: not the one still going
    assert state.ready(6500, 10, ordered=True) == []
    state.run_ended(1, attempt=2)
    assert [e.offset for e in state.ready(6500, 10, ordered=True)] == [2]


def test_an_overtaken_run_holds_its_partition_only_within_its_timeout() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1), row(2)], "g")
    (first,) = state.ready(5000, 10, ordered=True)
    state.dispatched(first, visible_again_ms=6000)
    state.dispatched(first, visible_again_ms=7000)
    state.finished(1, attempt=1)
    assert state.ready(6999, 10, ordered=True) == []
    assert [e.offset for e in state.ready(7000, 10, ordered=True)] == [2]


def test_scheduled_and_invisible_rows_wait() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1, deliver_after=8000), row(2, invisible_until=7000, retry_count=0),
                  row(3)], "g")
    (now,) = state.ready(5000, 10, False)
    assert now.offset == 3
    state.dispatched(now)
    assert state.next_due_ms(10, False) == 7000  # the invisible one comes back first
    assert [e.offset for e in state.ready(8000, 10, False)] == [1, 2]


def test_waiting_rows_are_not_due_while_the_partition_has_no_room() -> None:
    """Unordered with ``batch_size`` runs going, or ordered with one: what waits cannot
    start before a run's visibility timeout ends (or an outcome makes room)."""
    state = PartitionState("k", watermark=0)
    state.absorb([row(1), row(2), row(3)], "g")
    first, second = state.ready(5000, 2, False)
    state.dispatched(first, visible_again_ms=9000)
    assert state.next_due_ms(2, False) == 0  # room for one more: row 2 is due
    state.dispatched(second, visible_again_ms=9500)
    assert state.next_due_ms(2, False) == 9000  # full: the first run's timeout
    first.hold.push_back(12_000)  # extend_visibility
    assert state.next_due_ms(2, False) == 9500
    state.finished(2)
    assert state.next_due_ms(2, False) == 0  # room again


def test_an_ordered_run_going_holds_the_next_ones_until_its_timeout() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1), row(2)], "g")
    (first,) = state.ready(5000, 10, ordered=True)
    state.dispatched(first, visible_again_ms=9000)
    assert state.next_due_ms(10, True) == 9000
    assert state.next_due_ms(10, False) == 0  # unordered, the same rows could start
    state.finished(1)
    assert state.next_due_ms(10, True) == 0


def test_rows_acked_or_for_other_groups_are_done() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1, acked=True), row(2, consumer_group="other"), row(3)], "g")
    assert [e.offset for e in state.ready(5000, 10, False)] == [3]
    assert state.advance_candidate(horizon_ms=None) == 2


def test_watermark_needs_done_and_settled_rows() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1, created_at=100), row(2, created_at=200), row(3, created_at=300)], "g")
    state.finished(1)
    state.finished(3)
    assert state.advance_candidate(None) == 1  # 2 is not done
    state.finished(2)
    assert state.advance_candidate(horizon_ms=250) == 2  # 3 may still have late neighbours
    assert state.advance_candidate(horizon_ms=None) == 3
    state.moved_watermark(3)
    assert state.entries == {}


def test_watermark_closes_the_window_once_settled() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(5, created_at=100)], "g")
    state.fetched(rows_returned=1, limit=10, head=lambda: 40, now_ms=1000)
    state.finished(5)
    assert state.advance_candidate(horizon_ms=900) == 5  # the fetch may still be passed
    assert state.advance_candidate(horizon_ms=1001) == 40  # nothing can appear below 40


def test_give_back_restores_the_attempt() -> None:
    state = PartitionState("k", watermark=0)
    (entry,) = state.absorb([row(1, retry_count=2, invisible_until=0)], "g")
    state.dispatched(entry)
    assert entry.attempt == 4
    state.given_back(1)
    assert entry.attempt == 3 and not entry.in_flight


def test_busy_ignores_messages_scheduled_for_later() -> None:
    state = PartitionState("k", watermark=0)
    state.absorb([row(1, deliver_after=10_000)], "g")
    assert not state.busy(5000)
    state.absorb([row(2, invisible_until=9000, retry_count=1)], "g")
    assert state.busy(5000)  # waiting on a retry backoff


# -- registry and messages --------------------------------------------------------------------

def test_registry_rejects_bad_options_and_conflicts() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        consumer("t", group="g", max_attempts=0)
    with pytest.raises(ConfigurationError, match="group"):
        consumer("t", group="")
    consumer("unit.t", group="unit.g")(lambda m: None)
    try:
        with pytest.raises(ConfigurationError, match="already has a handler"):
            consumer("unit.t", group="unit.g")(print)
        with pytest.raises(ConfigurationError, match="nope"):
            select_consumers(["nope"])
    finally:
        unregister("unit.g", "unit.t")


def test_dead_letter_ids_fit_the_column() -> None:
    assert dead_letter_id("o-1", "billing") == "o-1@billing"
    long_id = dead_letter_id("x" * 255, "billing")
    assert len(long_id.encode()) <= 255 and long_id.startswith("sha256:")


def test_message_payload_and_extend_checks() -> None:
    message = Message(topic="t", partition_key="k", offset=1, id="i", body=b"\xff raw",
                      metadata={}, attempt=1, created_at_ms=0, published_at_ms=0,
                      consumer_group="g")
    assert message.payload == b"\xff raw"  # not JSON: handed over as bytes
    with pytest.raises(ValueError):
        message.extend_visibility(0)
    with pytest.raises(ValueError):
        Retry(delay=-1)


def test_fair_shares_add_up_to_every_partition() -> None:
    members = ["a", "b", "c"]
    assert [fair_share(1000, members, m) for m in members] == [334, 333, 333]
    assert fair_share(10, ["a"], "newcomer") == 5  # not seen alive yet: a cautious share


def test_free_partitions_hurry_the_lease_tick_at_most_once_a_second() -> None:
    now = ManualSeconds(100.0)
    keeper = LeaseKeeper("g", "t", "me", duration=30, renew_interval=10, host_clock=now)
    keeper._next_tick = now.now + 10  # just ticked
    keeper.notice_free()
    assert keeper.due()
    keeper._next_tick = now.now + 10  # ticked again at once
    now.now += FREE_LEASE_RECHECK / 2
    keeper.notice_free()
    assert not keeper.due()  # still free a moment later: no second early tick yet
    now.now += FREE_LEASE_RECHECK / 2
    keeper.notice_free()
    assert keeper.due()


class _Members:
    """A store that answers live_subscribers and list_leases with what the test sets."""

    def __init__(self, members: list[str], leases: dict[str, int] | None = None) -> None:
        self.members = members
        self.leases = leases or {}  # partition -> ms since renewal
        self.reads = 0

    def live_subscribers(self, cursor: Any, group: str, topic: str, within_ms: int) -> list[str]:
        self.reads += 1
        return list(self.members)

    def list_leases(self, cursor: Any, group: str, topic: str) -> list[tuple[str, str, int, int]]:
        return [(p, "a", 1, age) for p, age in self.leases.items()]


def test_a_membership_change_between_ticks_hurries_the_tick() -> None:
    # 1000 + 0.1 - 1000 >= 0.1 in floating point (100 + 0.1 - 100 is not)
    now = ManualSeconds(1000.0)
    keeper = LeaseKeeper("g", "t", "a", duration=30, renew_interval=10, host_clock=now)
    keeper.members = ["a"]
    keeper._next_tick = now.now + 10
    keeper._members_checked_at = now.now
    assert not keeper.membership_check_due()
    now.now += MEMBERSHIP_RECHECK
    assert keeper.membership_check_due()
    store = _Members(["a"], {"p1": 0})
    keeper.check_membership(None, store, ["p1"])  # type: ignore[arg-type]
    assert not keeper.due() and not keeper.membership_check_due()
    now.now += MEMBERSHIP_RECHECK
    store.members = ["a", "b"]  # a newcomer
    keeper.check_membership(None, store, ["p1"])  # type: ignore[arg-type]
    assert keeper.due() and store.reads == 2


@pytest.mark.parametrize("leases", [{"p1": 0}, {"p1": 0, "p2": 30_000}],
                         ids=["released", "expired"])
def test_a_partition_nobody_holds_between_ticks_hurries_the_tick(
        leases: dict[str, int]) -> None:
    # The fence locks only the subscriber's own lease rows; free partitions are noticed by
    # the plain reads of the busy subscriber's membership check instead.
    now = ManualSeconds(100.0)
    keeper = LeaseKeeper("g", "t", "a", duration=30, renew_interval=10, host_clock=now)
    keeper.members = ["a"]
    keeper._next_tick = now.now + 10
    keeper.check_membership(None, _Members(["a"], {"p1": 0, "p2": 0}),  # type: ignore[arg-type]
                            ["p1", "p2"])
    assert not keeper.due()
    keeper.check_membership(None, _Members(["a"], leases), ["p1", "p2"])  # type: ignore[arg-type]
    assert keeper.due()


def test_polling_adapts_to_traffic_and_falls_back_to_the_poll_interval() -> None:
    import dataclasses

    from sqlqueue.conf import QueueSettings
    from sqlqueue.consuming.runner import FIRST_QUICK_POLL, Runner
    from sqlqueue.consuming.server import Head

    runner = Runner([], conf=dataclasses.replace(QueueSettings(), POLL_INTERVAL=0.1))

    def delay_after_a_pass_that_saw(head: int | None) -> float:
        seen = Head(lambda: head if head is not None else 0)
        if head is not None:
            seen()
        return runner.pacer.polling_delay(seen)

    assert delay_after_a_pass_that_saw(5) == FIRST_QUICK_POLL  # the head moved
    quiet = [delay_after_a_pass_that_saw(5) for _ in range(8)]
    assert quiet[:4] == [FIRST_QUICK_POLL * 2 ** n for n in range(1, 5)]
    assert quiet[-1] == 0.1  # idle: once per POLL_INTERVAL
    assert delay_after_a_pass_that_saw(None) == 0.1  # a pass that did not read the head
    assert delay_after_a_pass_that_saw(6) == FIRST_QUICK_POLL  # a new message
    runner.pool.dispatched += 1  # work handed out
    assert delay_after_a_pass_that_saw(6) == FIRST_QUICK_POLL


def test_no_quick_polls_while_a_wake_up_channel_hears_other_processes() -> None:
    """With LISTEN (or Redis) subscribed, every publish rings the runner at its commit:
    after traffic it polls once per POLL_INTERVAL, as when idle; once the channel drops,
    quick polls come back."""
    import dataclasses

    from sqlqueue.conf import QueueSettings
    from sqlqueue.consuming.pacing import FIRST_QUICK_POLL
    from sqlqueue.consuming.runner import Runner
    from sqlqueue.consuming.server import Head
    from sqlqueue.consuming.wakeups import Wakeups

    class Channel:  # a Listener's state, without its thread
        def __init__(self) -> None:
            self.connected = threading.Event()
            self.deaf = None  # hears (a deaf one does not count: issue 51)

    conf = dataclasses.replace(QueueSettings(), POLL_INTERVAL=0.1)
    runner = Runner([], conf=conf)
    wakeups = Wakeups(conf, "default", [], lambda topic: None)  # no topic: no listener
    wakeups.listeners = [Channel()]  # type: ignore[list-item]
    runner.pacer.covered_by_wakeups = wakeups.cover_other_processes
    heads = iter(range(10, 100))

    def delay_after_a_pass_that_saw_a_new_message() -> float:
        seen = Head(lambda: next(heads))
        seen()
        return runner.pacer.polling_delay(seen)

    assert delay_after_a_pass_that_saw_a_new_message() == FIRST_QUICK_POLL  # not subscribed
    wakeups.listeners[0].connected.set()
    assert delay_after_a_pass_that_saw_a_new_message() == 0.1
    runner.pool.dispatched += 1  # work handed out: still no quick poll
    assert delay_after_a_pass_that_saw_a_new_message() == 0.1
    wakeups.listeners[0].connected.clear()  # the channel dropped: polling carries it
    assert delay_after_a_pass_that_saw_a_new_message() == FIRST_QUICK_POLL


def test_a_busy_subscriber_reads_the_head_for_discovery_ten_times_a_second_at_most() -> None:
    """A drain's passes follow each other every few milliseconds and read nothing else
    of the head: the look for new partitions reads it at most every
    MIN_DISCOVERY_INTERVAL while busy, and at every pass while idle (where the message
    that woke the pass may be a new partition's first)."""
    from sqlqueue.consuming import discovery

    now = ManualSeconds(1000.0)
    finder = discovery.PartitionFinder(group="g", topic="t", alias="default",
                                       leases=LeaseKeeper("g", "t", "a", 30, 10,
                                                          host_clock=now),
                                       start_latest=False, host_clock=now)
    finder._discovered_at_head = 7  # looked at head 7 already
    finder._next_discovery = now.now
    reads = []

    def head() -> int:
        reads.append(now.now)
        return 7

    for _ in range(10):  # ten busy passes in 50 ms: one read
        finder.discover(None, head, busy=True)  # type: ignore[arg-type]
        now.now += 0.005
    assert len(reads) == 1
    now.now += discovery.MIN_DISCOVERY_INTERVAL
    finder.discover(None, head, busy=True)  # type: ignore[arg-type]
    assert len(reads) == 2
    for _ in range(3):  # idle: every pass
        finder.discover(None, head)  # type: ignore[arg-type]
    assert len(reads) == 5


def test_a_look_a_busy_pass_skips_is_due_once_allowed() -> None:
    """A busy pass that does not read the head (the last read under
    MIN_DISCOVERY_INTERVAL ago) puts the look off to when it is allowed, as a look too
    soon after the last one does: the pass may have been woken by a new partition's first
    message, and the next one may be a poll interval away."""
    from sqlqueue.consuming import discovery

    now = ManualSeconds(1000.0)
    finder = discovery.PartitionFinder(group="g", topic="t", alias="default",
                                       leases=LeaseKeeper("g", "t", "a", 30, 10,
                                                          host_clock=now),
                                       start_latest=False, host_clock=now)
    finder._discovered_at_head = 7
    finder._next_discovery = now.now
    finder.discover(None, lambda: 7, busy=True)  # type: ignore[arg-type]  # reads the head
    assert finder.due_ms(5_000) is None
    now.now += 0.04
    finder.discover(None, lambda: 8, busy=True)  # type: ignore[arg-type]  # skipped
    interval_ms = round(discovery.MIN_DISCOVERY_INTERVAL * 1000)
    due = finder.due_ms(5_000)
    assert due is not None and 0 <= due - (5_000 + interval_ms - 40) <= 1  # ceil of ms


def test_a_sweep_s_window_is_sized_by_the_time_its_last_delete_took() -> None:
    """A deep collection's DELETEs aim at ``GC_CHUNK_SECONDS`` each (issue 52): a slow one
    shrinks the next window, a fast one at most doubles it, within the bounds."""
    from sqlqueue.consuming.gc import (
        GC_CHUNK_SECONDS,
        GC_SWEEP_MIN_WINDOW,
        GC_SWEEP_WINDOW,
        next_window,
    )

    assert next_window(8000, GC_CHUNK_SECONDS * 4) == 2000  # four times too slow
    assert next_window(2000, GC_CHUNK_SECONDS / 10) == 4000  # at most twice as wide
    assert next_window(8000, GC_CHUNK_SECONDS / 10) == GC_SWEEP_WINDOW
    assert next_window(600, 60.0) == GC_SWEEP_MIN_WINDOW  # a stalled database
    assert next_window(1000, 0.0) == 2000
