"""Where a consumer group that has no position on a topic starts (SPEC §10, issue 37):
``@consumer(..., start="earliest")`` (the default) at the oldest message still kept,
``start="latest"`` after the messages stored when it first runs."""

from __future__ import annotations

from typing import Any

import pytest

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.exceptions import ConfigurationError
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def journal(register: Any, group: str, **options: Any) -> list[int]:
    seen: list[int] = []
    register("t", group, lambda m: seen.append(m.offset), **options)
    return seen


def publish(count: int, first: int = 0) -> list[int]:
    sent = send_messages("t", [OutgoingMessage(n, partition_key=f"k{n % 2}")
                               for n in range(first, first + count)])
    return [s.offset for s in sent]


def test_a_group_added_later_starts_earliest_or_latest(register: Any) -> None:
    older = publish(3)  # nobody consumes "t" yet: every message is kept
    earliest = journal(register, "from-earliest")  # the default
    latest = journal(register, "from-latest", start="latest")
    drain(["from-earliest", "from-latest"])
    assert sorted(earliest) == older
    assert latest == []

    newer = publish(2, first=3)
    drain(["from-earliest", "from-latest"])
    assert sorted(earliest) == older + newer
    assert sorted(latest) == newer


def test_latest_applies_once_a_group_that_has_a_position_keeps_it(register: Any) -> None:
    publish(2)
    latest = journal(register, "g", start="latest")
    drain(["g"])  # placed at the heads of both partitions: the two are skipped
    sent = publish(4, first=2)
    drain(["g"])  # a restart: the group's position, not the heads
    assert sorted(latest) == sent
    more = publish(2, first=6)
    drain(["g"])
    assert sorted(latest) == sent + more


def test_start_is_earliest_or_latest() -> None:
    with pytest.raises(ConfigurationError, match="start is 'earliest' or 'latest'"):
        register_bad()


def register_bad() -> None:
    from sqlqueue import consumer

    consumer("t", group="g", start="newest")(lambda m: None)
