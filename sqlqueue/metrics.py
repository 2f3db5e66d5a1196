"""Prometheus metrics (``django-sqlqueue[metrics]``, docs/guides/monitoring.md).

``QueueStateCollector`` reads the queue's state at each scrape through
``sqlqueue.operations.state`` (bounded statements only: a scrape costs the same few
statements per subscription and one bounded probe per lagging partition, whatever the
number of stored messages). It is served by ``sqlqueue.views.metrics``.

``ProcessMetrics`` is one ``runconsumer``'s own counters and histograms
(``--metrics-port``).

Every gauge is labelled ``group`` and ``topic``. ``sqlqueue_pending_messages`` is a count
up to the lag service's caps; ``sqlqueue_pending_capped`` is 1 where it is "at least".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import cast

from prometheus_client import Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString as _untyped_float_text

from sqlqueue.consuming.instruments import DURATION_BUCKETS, Instruments
from sqlqueue.operations.lag_shapes import SEVERITY
from sqlqueue.operations.state import SubscriptionState, subscription_states

#: "database": the alias the subscription's tables are in (SQLQUEUE["DATABASE"], or a
#: route's: every database the queue lives in is read).
SUBSCRIPTION_LABELS = ["group", "topic", "database"]
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: messages per batch handler call (``sqlqueue_batch_size_messages``): up to MAX_BATCH_LIMIT
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


def _gauges() -> list[tuple[str, str, object]]:
    def pending(s: SubscriptionState) -> float:
        return float(s.lag.pending)

    def capped(s: SubscriptionState) -> float:
        return float(s.lag.pending_capped)

    def oldest(s: SubscriptionState) -> float:
        return s.lag.oldest_pending_age or 0.0

    return [
        ("sqlqueue_pending_messages",
         "Messages above the group's watermark, counted up to the lag service's cap "
         "(see sqlqueue_pending_capped).", pending),
        ("sqlqueue_pending_capped",
         "1 when a partition's pending count reached its cap (the count is a lower bound).",
         capped),
        ("sqlqueue_oldest_pending_seconds",
         "Seconds the oldest pending message has been due (0 when nothing is pending).",
         oldest),
        ("sqlqueue_in_flight_messages", "Messages on their first attempt, running now.",
         lambda s: float(s.lag.in_flight)),
        ("sqlqueue_retrying_messages",
         "Messages that failed at least once and are not yet acked or dead-lettered.",
         lambda s: float(s.lag.retrying)),
        ("sqlqueue_dead_letters",
         "Dead letters of the group waiting for triage (counted up to 10,000).",
         lambda s: float(s.lag.dead_letters)),
        ("sqlqueue_live_subscribers",
         "Subscribers whose heartbeat is younger than LEASE_DURATION.",
         lambda s: float(s.live_subscribers)),
    ]


class QueueStateCollector(Collector):
    """The state of every known subscription, read at each scrape."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Metric]:
        # Nothing: registering must not read the database (the default would collect).
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        states = subscription_states(self.using)
        for name, text, value in _gauges():
            family = GaugeMetricFamily(name, text, labels=SUBSCRIPTION_LABELS)
            for s in states:
                family.add_metric([s.group, s.topic, s.database],
                                  value(s))  # type: ignore[operator]
            yield family
        status = GaugeMetricFamily(
            "sqlqueue_status",
            "1 for the subscription's status (OK, WARN, STALL, STOP; the worst of its "
            "partitions'), 0 for the others.", labels=[*SUBSCRIPTION_LABELS, "status"])
        partitions = GaugeMetricFamily(
            "sqlqueue_partitions",
            "Partitions of the topic held by a live lease (state=held) or not (not_held).",
            labels=[*SUBSCRIPTION_LABELS, "state"])
        for s in states:
            current = s.lag.status
            for name in SEVERITY:
                status.add_metric([s.group, s.topic, s.database, name],
                                  float(name == current))
            where = [s.group, s.topic, s.database]
            partitions.add_metric([*where, "held"], float(s.held))
            partitions.add_metric([*where, "not_held"], float(s.partitions - s.held))
        yield status
        yield partitions
        yield from _schedule_gauges()
        yield GaugeMetricFamily("sqlqueue_scrape_duration_seconds",
                                "Seconds this scrape spent reading the queue's state.",
                                value=time.monotonic() - started)


def _schedule_gauges() -> Iterator[Metric]:
    """Per schedule: seconds since its last published tick (an alert when it exceeds the
    interval: no runconsumer publishes it) and until its next one."""
    from sqlqueue.operations.schedules import current_time_ms, schedule_overview

    now = current_time_ms()
    age = GaugeMetricFamily(
        "sqlqueue_schedule_last_tick_age_seconds",
        "Seconds since the schedule's last published tick (absent before the first).",
        labels=["schedule"])
    upcoming = GaugeMetricFamily(
        "sqlqueue_schedule_next_tick_seconds",
        "Seconds until the schedule's next tick (negative: due, not yet published).",
        labels=["schedule"])
    for view in schedule_overview(now):
        if view.schedule is None:
            continue
        if view.row is not None and view.row.last_tick is not None:
            age.add_metric([view.name], (now - view.row.last_tick) / 1000)
        if view.next_tick_ms is not None:
            upcoming.add_metric([view.name], (view.next_tick_ms - now) / 1000)
    yield age
    yield upcoming


#: a sample's value as the exposition writes it ("1.0", "+Inf", "1.2345678901e+010")
_float_text = cast(Callable[[float], str], _untyped_float_text)


def gauges_text(registry: CollectorRegistry, openmetrics: bool = False) -> bytes:
    """The exposition of a registry of gauges (``queue_state_registry``'s), in the
    Prometheus text format 0.0.4 or OpenMetrics 1.0: the bytes ``prometheus_client``'s
    ``generate_latest`` writes (tests/integration/test_metrics.py compares them), at a
    tenth of its cost: it checks each label name of each sample (1,500 subscriptions are
    21,000 samples: 0.4 s a scrape; issue 52)."""
    lines = []
    for family in registry.collect():
        assert family.type == "gauge", family.name
        documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        if openmetrics:
            documentation = documentation.replace('"', r'\"')
        lines.append(f"# HELP {family.name} {documentation}\n# TYPE {family.name} gauge\n")
        for sample in family.samples:
            value = _float_text(sample.value)
            if not sample.labels:
                lines.append(f"{sample.name} {value}\n")
                continue
            labels = ",".join([f'{name}="{_label_value(text)}"'
                               for name, text in sorted(sample.labels.items())])
            lines.append(f"{sample.name}{{{labels}}} {value}\n")
    if openmetrics:
        lines.append("# EOF\n")
    return "".join(lines).encode()


def _label_value(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def queue_state_registry(using: str | None = None) -> CollectorRegistry:
    """A registry holding only the queue-state collector (one per request: nothing global)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueStateCollector(using))
    return registry


class ProcessMetrics(Instruments):
    """One ``runconsumer`` process's own counters and histograms, in a registry of its own
    (served on ``--metrics-port``). Each process serves its own port: with several
    processes on one host, give each its port (Prometheus adds an ``instance`` label per
    target), so no multiprocess mode is needed."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["group", "topic"]
        self._handled = Counter("sqlqueue_handled", "Handler runs finished, by outcome "
                                "(ack, acked, retry, fail, reject).", [*labels, "outcome"],
                                registry=self.registry)
        self._duration = Histogram("sqlqueue_handler_duration_seconds",
                                   "How long handlers ran.", labels, registry=self.registry,
                                   buckets=DURATION_BUCKETS)
        self._latency = Histogram("sqlqueue_start_latency_seconds",
                                  "From a message being due (published, or its "
                                  "deliver_after) to its handler starting.", labels,
                                  registry=self.registry, buckets=LATENCY_BUCKETS)
        self._batch_size = Histogram("sqlqueue_batch_size_messages",
                                     "Messages per call of a batch consumer's handler.",
                                     labels, registry=self.registry, buckets=BATCH_BUCKETS)
        self._polls = Counter("sqlqueue_polls", "Passes over a subscription that could "
                              "deliver.", labels, registry=self.registry)
        self._delivered = Counter("sqlqueue_delivered", "Messages handed to handler threads.",
                                  labels, registry=self.registry)
        self._statements = Counter("sqlqueue_statements", "SQL statements of the consumer "
                                   "loop's connection (handlers' own not counted).",
                                   registry=self.registry)
        self._leases = Counter("sqlqueue_lease_changes", "Partitions this process started "
                               "(change=gained) or stopped (change=lost) holding.",
                               [*labels, "change"], registry=self.registry)
        self._reconnects = Counter("sqlqueue_reconnects", "Database connections the consumer "
                                   "loop lost and opened again.", registry=self.registry)

    def handled(self, group: str, topic: str, outcome: str, duration: float,
                latency: float) -> None:
        if outcome == "not_started":
            return
        self._handled.labels(group, topic, outcome).inc()
        self._duration.labels(group, topic).observe(duration)
        self._latency.labels(group, topic).observe(latency)

    def batch(self, group: str, topic: str, size: int) -> None:
        self._batch_size.labels(group, topic).observe(size)

    def polled(self, group: str, topic: str, delivered: int) -> None:
        self._polls.labels(group, topic).inc()
        if delivered:
            self._delivered.labels(group, topic).inc(delivered)

    def statement(self) -> None:
        self._statements.inc()

    def leases_changed(self, group: str, topic: str, gained: int, lost: int) -> None:
        if gained:
            self._leases.labels(group, topic, "gained").inc(gained)
        if lost:
            self._leases.labels(group, topic, "lost").inc(lost)

    def reconnected(self) -> None:
        self._reconnects.inc()

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve this registry over HTTP on a daemon thread, on ``address`` (this host
        only by default: no authentication here; ``""`` or ``0.0.0.0``: every interface)."""
        start_http_server(port, addr=address, registry=self.registry)
