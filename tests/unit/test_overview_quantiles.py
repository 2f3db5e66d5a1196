"""The live overview's percentiles are Prometheus' ``histogram_quantile`` over the same
buckets as ``sqlqueue_handler_duration_seconds``, and a run lands in the bucket
Prometheus puts it in (``le``: a value equal to a bound is in that bound's bucket)."""

from __future__ import annotations

import pytest

from sqlqueue.conf import DURATION_BUCKETS
from sqlqueue.consuming.rollup import duration_column
from sqlqueue.operations.overview import histogram_quantile

EMPTY = [0] * (len(DURATION_BUCKETS) + 1)


def counts(**by_index: int) -> list[int]:
    buckets = list(EMPTY)
    for index, count in by_index.items():
        buckets[int(index.lstrip("b"))] = count
    return buckets


def test_no_runs_have_no_percentile() -> None:
    assert histogram_quantile(0.5, EMPTY) is None


def test_the_first_bucket_interpolates_from_zero() -> None:
    assert histogram_quantile(0.5, counts(b0=4)) == pytest.approx(0.0025)


def test_the_rank_is_interpolated_within_its_bucket() -> None:
    # 10 runs: 9 in (0.01, 0.025], 1 in (0.5, 1]: p50 rank 5 of 9 in the first, p95 in
    # the last at rank 9.5, half-way through its bucket.
    buckets = counts(b2=9, b7=1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01 + 0.015 * 5 / 9)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.75)


def test_runs_past_the_last_bound_answer_the_last_bound() -> None:
    assert histogram_quantile(0.95, counts(b0=1, b14=9)) == DURATION_BUCKETS[-1]


@pytest.mark.parametrize(("seconds", "column"), [
    (0.0, "duration_00"), (0.005, "duration_00"), (0.0051, "duration_01"),
    (1.0, "duration_07"), (300.0, "duration_13"), (301.0, "duration_14"),
])
def test_a_run_lands_in_prometheus_bucket(seconds: float, column: str) -> None:
    assert duration_column(seconds) == column
