"""The lag status rules, the charts and the admin's filters: pure functions, no database."""

from __future__ import annotations

import dataclasses

import pytest

from sqlqueue.admin.charts import STATUS_COLORS, pending_columns, pending_labels, status_strip
from sqlqueue.operations import COUNT_CAP
from sqlqueue.operations.lag import (
    COUNT_BUDGET,
    MIN_PARTITION_CAP,
    STALL_AFTER,
    WARN_AFTER,
    GroupLag,
    PartitionLag,
    _pair_cap,
    partition_status,
)
from sqlqueue.templatetags.sqlqueue_admin import age, at_least, first_of

CAUGHT_UP = PartitionLag(
    partition_key="k", head_offset=10, watermark=10, lagging=False, pending=0, in_flight=0,
    retrying=0, dead_letters=0, oldest_pending_age=None, leased_by="w1", lease_age=1.0,
    watermark_age=1000.0,
)


def lag(**changes: object) -> PartitionLag:
    """A partition; with ``pending``, that many messages are stored above the watermark."""
    pending = changes.get("pending") or 0
    assert isinstance(pending, int)
    changes.setdefault("head_offset", CAUGHT_UP.watermark + pending)
    changes.setdefault("lagging", pending > 0)
    return dataclasses.replace(CAUGHT_UP, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("changes", "status"), [
    ({}, "OK"),
    ({"leased_by": ""}, "OK"),  # nothing pending: nobody needs to hold it
    ({"pending": 3, "oldest_pending_age": 1.0}, "OK"),  # keeping up
    ({"pending": 3, "oldest_pending_age": 1.0, "leased_by": ""}, "STOP"),
    ({"pending": 3, "oldest_pending_age": WARN_AFTER + 1}, "WARN"),
    ({"retrying": 1}, "WARN"),
    ({"dead_letters": 2}, "WARN"),
    ({"pending": 3, "oldest_pending_age": STALL_AFTER + 1}, "STALL"),
    # An idle partition whose watermark has not moved for long gets a new message: the
    # message is young, so the consumer is not stalled.
    ({"pending": 1, "oldest_pending_age": 2.0}, "OK"),
    ({"pending": 3, "oldest_pending_age": STALL_AFTER + 1, "watermark_age": 5.0}, "WARN"),
    ({"pending": 3, "oldest_pending_age": STALL_AFTER + 1, "leased_by": ""}, "STOP"),
])
def test_partition_status_rules(changes: dict[str, object], status: str) -> None:
    assert partition_status(lag(**changes)) == status


def test_a_group_shows_its_worst_partition() -> None:
    group = GroupLag("g", "t", 0, [lag(status="OK"), lag(status="STALL"), lag(status="WARN")])
    assert group.status == "STALL"
    assert GroupLag("g", "t", 0).status == "OK"


def test_the_count_budget_is_shared_among_lagging_partitions_of_a_topic() -> None:
    assert _pair_cap(0) == COUNT_CAP
    assert _pair_cap(1) == COUNT_CAP
    assert _pair_cap(500) == COUNT_BUDGET // 500
    assert _pair_cap(COUNT_BUDGET // MIN_PARTITION_CAP) == MIN_PARTITION_CAP
    # Beyond that, a probe per pair would cost more than the count is worth: not counted.
    assert _pair_cap(COUNT_BUDGET // MIN_PARTITION_CAP + 1) is None


def test_charts_escape_keys_and_colour_by_status() -> None:
    partitions = [lag(partition_key="<script>", status="STOP", pending=5),
                  lag(partition_key="b", status="OK")]
    strip = str(status_strip(partitions))
    columns = str(pending_columns(partitions))
    for svg in (strip, columns):
        assert "<script>" not in svg and "&lt;script&gt;" in svg
        assert STATUS_COLORS["STOP"] in svg and STATUS_COLORS["OK"] in svg
    assert 'height="0"' in columns  # the caught-up partition has no column
    assert "no partitions" in str(status_strip([]))


def test_the_pending_chart_has_a_scale_and_partition_labels() -> None:
    """Issue 37: the chart had no labels."""
    partitions = [lag(partition_key="<b>eu</b>", status="STOP", pending=5),
                  lag(partition_key="us", status="OK")]
    scale, keys = map(str, pending_labels(partitions))
    assert "pending messages per partition (tallest: 5)" in scale
    assert keys.count("<span") == 2 and "&lt;b&gt;eu&lt;/b&gt;" in keys and "<b>" not in keys
    many = [lag(partition_key=f"k{n:03}", status="OK") for n in range(100)]
    _, summary = map(str, pending_labels(many))
    assert ">k000<" in summary and ">k099<" in summary and "100 partitions, in key order" in summary


def test_filters() -> None:
    assert age(None) == "-"
    assert age(3.14) == "3.1 s"
    assert age(45) == "45 s"
    assert age(600) == "10 min"
    assert age(3 * 3600) == "3 h"
    assert age(5 * 86_400) == "5 d"
    assert at_least(10, True) == ">=10" and at_least(10, False) == "10"
    assert first_of(["a", "b", "c"], 2) == "a, b and 1 more"
    assert first_of(["a"], 2) == "a"
