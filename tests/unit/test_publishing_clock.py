"""The publishing path reads this host's clock through the one it is given
(``sqlqueue.clocks``, issue 54): ``published_at``, a UUIDv7 id's time and the bound of a
``deliver_at``, stepped here on a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sqlqueue.exceptions import InvalidMessage
from sqlqueue.publishing.messages import (
    MAX_DELAY_SECONDS,
    host_now_ms,
    new_message_id,
    now_ms,
    schedule,
)
from tests.manual_clock import ManualSeconds


def test_published_at_is_the_given_clock_s() -> None:
    assert now_ms(ManualSeconds(1_700_000_000.25)) == 1_700_000_000_250
    assert host_now_ms(ManualSeconds(0.0009)) == 0  # rounded down, as time_ns was


def test_a_message_id_carries_the_given_clock_s_milliseconds() -> None:
    clock = ManualSeconds(1_700_000_000.0)
    first = new_message_id(clock)
    clock.sleep(1.0)
    second = new_message_id(clock)
    stamp = f"{1_700_000_000_000:012x}"
    assert first.replace("-", "")[:12] == stamp
    assert second.replace("-", "")[:12] == f"{1_700_000_001_000:012x}"
    assert first < second  # in id order: the log's index order (issue 52)


def test_deliver_at_is_bounded_from_the_publisher_s_now() -> None:
    now = 1_700_000_000_000
    far = datetime.fromtimestamp(now / 1000 + MAX_DELAY_SECONDS + 60, tz=UTC)
    with pytest.raises(InvalidMessage, match="more than a century ahead"):
        schedule(None, far, now)
    assert schedule(None, far, now + 120_000) == (None, round(far.timestamp() * 1000))
