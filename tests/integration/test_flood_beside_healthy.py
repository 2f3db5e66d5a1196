"""A flood of failures does not starve the healthy (issue 56): one partition whose every
message fails (a plain exception, many attempts, a short backoff) beside healthy
partitions of the same group and another group of the same runner; the healthy messages'
latency, publish to handled, stays within 2x of the same runner's without the flood.
Latencies are read on the database clock (the message's ``created_at``, and the clock
read by the handler), and compared with each other, never with a constant."""

from __future__ import annotations

import statistics
import threading
from typing import Any

import pytest
from django.db import connection

from sqlqueue import Message, OutgoingMessage, send_messages, storage
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import QueueMessage
from tests.integration.consuming_helpers import fast_settings, register, run_until

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]

HEALTHY = ("h0", "h1", "h2", "h3")
WAVES = 12
FLOOD = 400


class Handled:
    """Each healthy message's handling time on the database clock, by offset."""

    def __init__(self) -> None:
        self.at: dict[int, int] = {}
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        if message.partition_key == "bad":
            raise RuntimeError("the downstream service is down")
        with connection.cursor() as cursor:
            now = storage.store(connection).database_now_ms(cursor)
        with self.lock:
            self.at[message.offset] = now


def created_at(offsets: list[int]) -> dict[int, int]:
    """When the database stamped these messages (read before garbage collection may
    delete them, once handled)."""
    return dict(QueueMessage.objects.filter(offset__in=offsets)
                .values_list("offset", "created_at"))


def healthy_waves(runner: Runner, handled: Handled) -> list[int]:
    """Waves of healthy messages (both groups), each handled before the next is sent:
    their latencies, sorted."""
    created: dict[int, int] = {}
    for wave in range(WAVES):
        sent = [*send_messages("t", [OutgoingMessage(wave, partition_key=p) for p in HEALTHY]),
                *send_messages("u", [OutgoingMessage(wave, partition_key=p)
                                     for p in HEALTHY[:2]])]
        created.update(created_at([s.offset for s in sent]))
        run_until(runner, lambda sent=sent: all(s.offset in handled.at for s in sent))
    return sorted(handled.at[o] - at for o, at in created.items())


def p90(values: list[int]) -> float:
    return statistics.quantiles(values, n=10)[-1]


@pytest.mark.xfail(strict=False, reason=(
    "issue 56, open: under a flood the failing partition's retries (a batch redelivered "
    "every backoff, each run formatting its traceback) share the handler pool and each "
    "pass's writes with the healthy partitions; seen at 1.3-1.8x on SQLite, MariaDB and "
    "PostgreSQL but also 2.04x (main) and 3x (this branch) on PostgreSQL under load. "
    "The fix (a failing partition's share of the pool) is not done."))
def test_healthy_partitions_keep_their_latency_beside_a_flood(register: Any) -> None:
    handled = Handled()
    options = {"max_attempts": 1_000_000, "min_backoff": 0.01, "max_backoff": 0.02}
    register("t", "g", handled, **options)
    register("u", "other", handled, **options)
    conf = fast_settings()
    runner = Runner(select_consumers(["g", "other"]), conf=conf)
    runner.start_handler_threads()
    try:
        calm = healthy_waves(runner, handled)
        send_messages("t", [OutgoingMessage(n, partition_key="bad") for n in range(FLOOD)])
        stats = runner.subscribers[0].stats
        run_until(runner, lambda: stats["retried"] >= FLOOD)  # the flood is on
        before = stats["retried"]
        flooded = healthy_waves(runner, handled)
        assert stats["retried"] > before + WAVES  # and it went on all along
    finally:
        runner.stop()
        runner.shutdown()
    # Within 2x, or within one poll interval of it (what a pass costs at best).
    poll_ms = conf.POLL_INTERVAL * 1000
    assert statistics.median(flooded) <= 2 * max(statistics.median(calm), poll_ms), (
        calm, flooded)
    assert p90(flooded) <= 2 * max(p90(calm), poll_ms), (calm, flooded)
