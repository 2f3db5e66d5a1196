"""The runners' per-minute rollup behind the admin's live overview (issue 42): from a real
run, its rows agree with the Prometheus registry of the same runner (outcome counts,
duration buckets, hence the percentiles), and garbage collection deletes old rows."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import sqlqueue
from sqlqueue import OutgoingMessage, send_messages, storage
from sqlqueue.conf import DURATION_BUCKETS
from sqlqueue.consuming.clock import HostClock
from sqlqueue.consuming.gc import GarbageCollector
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.rollup import KEEP_MS, MinuteRollup, collect_minute_stats
from sqlqueue.consuming.runner import Runner
from sqlqueue.metrics import ProcessMetrics
from sqlqueue.operations.overview import activity, histogram_quantile
from tests.integration.consuming_helpers import RUN_TIMEOUT, fast_settings, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def run_with_rollup(groups: list[str], metrics: ProcessMetrics,
                    host_clock: HostClock | None = None) -> MinuteRollup:
    runner = Runner(select_consumers(groups, []), until_empty=True,
                    conf=fast_settings(MAX_ATTEMPTS=2), instruments=metrics,
                    host_clock=host_clock)
    rollup = MinuteRollup.of(runner)
    runner.pacer.add_timer(rollup)
    thread = threading.Thread(target=lambda: (runner.run(install_signal_handlers=False),
                                              rollup.flush(), connections.close_all()))
    thread.start()
    thread.join(RUN_TIMEOUT)
    assert not thread.is_alive(), "the runner did not finish"
    return rollup


def prometheus(metrics: ProcessMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class DeclaredWork:
    """The host clock the handler pool times handlers with (its ``wall()``), on the test's
    terms: a handler lasts exactly the work it declares, however loaded the machine (a
    real 30 ms sleep landed in a later bucket at load 8). Passed to the runner
    (``Runner(host_clock=...)``), not patched into a module."""

    def __init__(self) -> None:
        self.base = time.time()
        self.spent = threading.local()

    def wall(self) -> float:
        return self.base + getattr(self.spent, "seconds", 0.0)

    def monotonic(self) -> float:  # timers and handler timeouts stay on the real clock
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def work(self, seconds: float) -> None:
        self.spent.seconds = getattr(self.spent, "seconds", 0.0) + seconds


def test_the_rollup_agrees_with_the_prometheus_registry(register: Any) -> None:
    clock = DeclaredWork()

    def handler(message: sqlqueue.Message) -> None:
        if message.payload == "slow":
            clock.work(0.03)  # the handler's work: lands in the 0.05 s bucket
        if message.payload == "reject":
            raise sqlqueue.Reject("no")
        if message.payload == "retry" and message.attempt == 1:
            raise sqlqueue.Retry(delay=0, reason="again")
        if message.payload == "fail":
            raise ValueError("always")  # twice: MAX_ATTEMPTS=2, then a dead letter

    register("t", "g", handler)
    payloads = ["ok"] * 6 + ["slow"] * 3 + ["reject", "retry", "fail"]
    send_messages("t", [OutgoingMessage(p, partition_key=f"k{i % 3}")
                        for i, p in enumerate(payloads)])
    metrics = ProcessMetrics()
    run_with_rollup(["g"], metrics, host_clock=clock)

    [sub] = activity()
    total = sub.total
    s = prometheus(metrics)
    labels = (("group", "g"), ("topic", "t"))
    for outcome in ("ack", "acked", "retry", "fail", "reject"):
        key = ("sqlqueue_handled_total", tuple(sorted((*labels, ("outcome", outcome)))))
        assert total.handled[outcome] == s.get(key, 0), outcome
    cumulative = 0
    for bound, count in zip(DURATION_BUCKETS, total.durations, strict=False):
        cumulative += count
        le = ("le", str(float(bound)))
        assert cumulative == s[("sqlqueue_handler_duration_seconds_bucket",
                                tuple(sorted((*labels, le))))], bound
    assert sum(total.durations) == s[("sqlqueue_handler_duration_seconds_count", labels)]
    # ack: 6 ok + 3 slow + the retried one's second attempt; the failing one twice.
    assert (total.handled["ack"], total.handled["fail"], total.handled["reject"],
            total.handled["retry"]) == (10, 2, 1, 1)
    assert (total.published, total.acked, total.retried, total.dead_lettered) == (12, 10, 2, 2)
    assert total.durations[3] >= 3  # the slow ones: 0.025 < d <= 0.05
    assert total.p95 is not None and 0.025 < total.p95 <= 0.05
    assert total.p50 == histogram_quantile(0.5, total.durations) and total.p50 <= 0.005


def test_the_minutes_are_the_database_clock_s_and_the_hour_is_zero_filled(
        register: Any) -> None:
    register("t", "g", lambda message: None)
    send_messages("t", [OutgoingMessage(n) for n in range(3)])
    run_with_rollup(["g"], ProcessMetrics())
    with connection.cursor() as cursor:
        now = storage.store(connection).database_now_ms(cursor)
    [sub] = activity()
    assert len(sub.minutes) == 60 and sub.minutes[-1].start_ms == now - now % 60_000
    assert sum(m.acked for m in sub.minutes) == 3 == sub.total.acked
    assert sum(m.published for m in sub.minutes[:-2]) == 0  # published just now


def test_garbage_collection_deletes_the_rows_older_than_it_keeps() -> None:
    with connection.cursor() as cursor:
        store = storage.store(connection)
        now = store.database_now_ms(cursor)
        minute = now - now % 60_000
        old = minute - KEEP_MS - 60_000
        store.add_minute_stats(cursor, {("g", "t", old): {"ack": 5},
                                          ("g", "t", minute): {"ack": 1}})
    collector = GarbageCollector(fast_settings(), "default", {})
    with connection.cursor() as cursor:
        collector.collect(cursor, force=True)
        rows = storage.store(connection).read_minute_stats(cursor, 0, ("ack",))
    assert [(r[2], int(r[3])) for r in rows] == [(minute, 1)]
    assert collect_minute_stats("default", 1000) == (0, False)  # nothing left to delete


def test_the_timer_writes_every_ten_seconds_what_every_thread_counted(
        register: Any) -> None:
    register("t", "g", lambda message: None)
    send_messages("t", [OutgoingMessage(n) for n in range(2)])
    runner = Runner(select_consumers(["g"], []), conf=fast_settings())
    clock = {"ms": 0}
    rollup = MinuteRollup(runner.instruments, alias="default", conf=runner.conf,
                          now_ms=lambda: clock["ms"], estimate_ms=lambda: 120_000)
    rollup.run_due()  # the first turn writes (nothing yet)
    assert rollup.next_due_ms() == 10_000
    first, second = fetched_deliveries(runner)
    rollup.finished(first, "ack", 0.001)  # on this thread, and on another
    other = threading.Thread(target=lambda: rollup.finished(second, "ack", 0.001))
    other.start()
    other.join()
    clock["ms"] = 9_999
    rollup.run_due()
    assert rows() == []  # not yet
    clock["ms"] = 10_000
    rollup.run_due()
    # Acked in the minute of the clock, published in the minute of their created_at.
    assert [(r[2], int(r[3]), int(r[4])) for r in rows()] == [(60_000, 0, 2), (120_000, 2, 0)]
    assert rollup.next_due_ms() == 20_000


def fetched_deliveries(runner: Runner) -> list[Any]:
    from sqlqueue.consuming.handlers import Delivery
    from sqlqueue.storage.sql.tables import FetchedRow

    consumer = runner.subscribers[0].consumer
    deliveries = []
    for offset in (1, 2):
        row = FetchedRow.__new__(FetchedRow)
        for name, value in (("offset", offset), ("created_at", 60_000), ("deliver_after", 0)):
            object.__setattr__(row, name, value)
        deliveries.append(Delivery(consumer=consumer, alias="default", partition_key="",
                                   row=row, attempt=1, sequence=offset))
    return deliveries


def rows() -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        return storage.store(connection).read_minute_stats(cursor, 0, ("ack", "published"))
