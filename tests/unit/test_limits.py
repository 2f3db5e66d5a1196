"""Flow limits without a database: shares, the token bucket, warm-up (#17)."""

from __future__ import annotations

import pytest

from sqlqueue.consuming.limits import Limits, TokenBucket, member_share
from sqlqueue.consuming.registry import consumer
from sqlqueue.exceptions import ConfigurationError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("total", [1, 2, 3, 7, 10, 64])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_in_flight_shares_add_up_to_the_limit_exactly(total: int, count: int) -> None:
    members = [f"worker-{n}" for n in range(count)]
    shares = [member_share(total, members, m) for m in members]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_a_member_not_yet_seen_counts_itself_in() -> None:
    assert member_share(4, ["a", "b"], "c") == 1
    assert member_share(4, [], "a") == 4


def test_the_bucket_allows_its_rate_and_a_small_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, clock)
    assert bucket.available() == 1  # the first message need not wait
    bucket.spend(1)
    assert bucket.available() == 0
    assert bucket.wait() == pytest.approx(0.1)
    clock.now += 0.15
    assert bucket.available() == 1
    clock.now += 60  # idle for a minute: at most BURST_SECONDS' worth, and at least 2
    assert bucket.available() == 2
    started = 0
    for _ in range(1000):  # 10 s in 10 ms steps
        clock.now += 0.01
        take = bucket.available()
        bucket.spend(take)
        started += take
    assert 99 <= started <= 102


def test_a_rate_share_of_zero_never_allows_and_never_wakes() -> None:
    bucket = TokenBucket(0.0, FakeClock())
    bucket.spend(1)
    assert bucket.available() == 0 and bucket.wait() is None


def test_rate_share_follows_the_leases() -> None:
    clock = FakeClock()
    limits = Limits(20.0, None, warm_up=1.0, now=clock)
    limits.share_leases(1, 4)
    assert limits.bucket is not None and limits.bucket.rate == 5.0
    limits.share_leases(0, 4)
    assert limits.bucket.rate == 0.0


def test_a_newcomer_to_a_running_group_waits_a_renew_interval() -> None:
    clock = FakeClock()
    limits = Limits(None, 4, warm_up=10.0, now=clock)
    assert limits.allowance(0, [], "b") == 0  # not yet seen alive
    assert limits.allowance(0, ["a", "b"], "b") == 0  # seen, among others: warming up
    clock.now += 10
    assert limits.allowance(0, ["a", "b"], "b") == 2
    assert limits.allowance(1, ["a", "b"], "b") == 1
    alone = Limits(None, 4, warm_up=10.0, now=clock)
    assert alone.allowance(1, ["a"], "a") == 3  # first of its group: nobody to wait for


@pytest.mark.parametrize(("option", "bad"), [
    ("rate_limit", 0), ("rate_limit", -2), ("rate_limit", "5"), ("rate_limit", True),
    ("rate_limit", float("inf")), ("max_in_flight", 0), ("max_in_flight", 1.5),
    ("max_in_flight", "3"), ("max_in_flight", False),
])
def test_bad_limits_are_refused_at_registration(option: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=f"{option} is a"):
        consumer("t", group="g", **{option: bad})  # type: ignore[arg-type]


def test_a_delivery_refused_for_its_lease_cannot_be_taken_back_again() -> None:
    """A handler thread that finds the lease untrusted reports the delivery not started;
    the main thread must not also take it back (it would count it out of flight twice:
    the recycling stall of #17)."""
    from sqlqueue.consuming.handlers import Delivery, Unchecked
    from sqlqueue.consuming.registry import Consumer
    from tests.unit.test_consuming_units import row

    class Untrusted(Unchecked):
        def may_start(self, delivery: Delivery) -> bool:
            return False

    delivery = Delivery(Consumer("t", "g", print), "default", "k", row(1), 1, 0,
                        view=Untrusted())
    assert not delivery.start()
    assert delivery.refused and not delivery.give_back()
    queued = Delivery(Consumer("t", "g", print), "default", "k", row(2), 1, 1)
    assert queued.give_back() and not queued.start() and not queued.refused
