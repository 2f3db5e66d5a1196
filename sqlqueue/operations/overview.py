"""The live overview's numbers (issue 42): per (group, topic), what the runners handled in
each minute of the last hour, from the per-minute rollup they keep
(``sqlqueue.consuming.rollup``, table ``queue_minute_stats``).

Definitions (the page says them too):

- published: messages first delivered to the group, in the minute they were published;
- acked: runs that ended in an ack (``ack`` and ``acked`` of ``sqlqueue_handled_total``);
- retried: runs that failed and will be delivered again (``fail`` and ``retry`` before
  the last attempt);
- dead-lettered: runs that ended in a dead letter (``reject``, or a failure at the last
  attempt);
- p50/p95: handler duration percentiles from the same buckets as
  ``sqlqueue_handler_duration_seconds``, interpolated as Prometheus'
  ``histogram_quantile`` does, so they agree with a query over ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import connections

from sqlqueue import storage
from sqlqueue.conf import DURATION_BUCKETS, get_settings
from sqlqueue.consuming.rollup import MINUTE_MS
from sqlqueue.models.stats import DURATION_COLUMNS, OUTCOMES

#: minutes the page shows, the current one last
WINDOW_MINUTES = 60
COLUMNS = ("published", "dead_lettered", *OUTCOMES, "duration_sum", *DURATION_COLUMNS)


@dataclass
class Minute:
    """One minute of one subscription (zeros for a minute nothing happened in)."""

    start_ms: int
    published: int = 0
    acked: int = 0
    retried: int = 0
    dead_lettered: int = 0
    handled: dict[str, int] = field(default_factory=dict)  # by outcome label
    durations: list[int] = field(default_factory=lambda: [0] * len(DURATION_COLUMNS))

    @property
    def p50(self) -> float | None:
        return histogram_quantile(0.5, self.durations)

    @property
    def p95(self) -> float | None:
        return histogram_quantile(0.95, self.durations)


@dataclass
class SubscriptionActivity:
    """A (group, topic)'s last hour: ``minutes`` oldest first, and the hour's totals."""

    group: str
    topic: str
    minutes: list[Minute]
    total: Minute


def histogram_quantile(q: float, buckets: Sequence[int]) -> float | None:
    """The ``q`` quantile of non-cumulative bucket counts over ``DURATION_BUCKETS`` (the
    last count: past the last bound), as Prometheus computes it: linear within the bucket
    the rank falls in, from 0 for the first; the last bound for the overflow bucket.
    None without observations."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for index, count in enumerate(buckets):
        if count and below + count >= rank:
            if index == len(DURATION_BUCKETS):
                return float(DURATION_BUCKETS[-1])
            lower = 0.0 if index == 0 else float(DURATION_BUCKETS[index - 1])
            upper = float(DURATION_BUCKETS[index])
            return lower + (upper - lower) * (rank - below) / count
        below += count
    return float(DURATION_BUCKETS[-1])


def _add(minute: Minute, values: dict[str, float]) -> None:
    handled = {o: int(values[o]) for o in OUTCOMES}
    for outcome, count in handled.items():
        minute.handled[outcome] = minute.handled.get(outcome, 0) + count
    dead = int(values["dead_lettered"])
    minute.published += int(values["published"])
    minute.acked += handled["ack"] + handled["acked"]
    minute.dead_lettered += dead
    minute.retried += max(0, handled["fail"] + handled["retry"] + handled["reject"] - dead)
    for index, column in enumerate(DURATION_COLUMNS):
        minute.durations[index] += int(values[column])


def activity(using: str | None = None, now_ms: int | None = None,
             minutes: int = WINDOW_MINUTES) -> list[SubscriptionActivity]:
    """Every (group, topic) with a row in the last ``minutes`` minutes (database time),
    in name order."""
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    with connection.cursor() as cursor:
        store = storage.store(connection)
        now = store.database_now_ms(cursor) if now_ms is None else now_ms
        first = now - now % MINUTE_MS - (minutes - 1) * MINUTE_MS
        rows = store.read_minute_stats(cursor, first, COLUMNS)
    found: dict[tuple[str, str], SubscriptionActivity] = {}
    for group, topic, start, *values in rows:
        key = (str(group), str(topic))
        if key not in found:
            found[key] = SubscriptionActivity(
                *key, [Minute(first + i * MINUTE_MS) for i in range(minutes)], Minute(first))
        by_column = dict(zip(COLUMNS, values, strict=True))
        index = (int(start) - first) // MINUTE_MS
        if 0 <= index < minutes:  # a runner's clock ahead of this one: not shown
            _add(found[key].minutes[index], by_column)
            _add(found[key].total, by_column)
    return [found[key] for key in sorted(found)]
