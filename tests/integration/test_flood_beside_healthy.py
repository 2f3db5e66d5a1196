"""A flood of failures does not starve the healthy (issue 56): one partition whose every
message fails (a plain exception, after waiting on a downstream that is down, many
attempts, a short backoff) beside healthy partitions of the same group and another group
of the same runner; the healthy messages' latency, publish to handled, stays within 2x of
the same runner's without the flood.

Calm and flooded blocks of waves alternate (the downstream goes down, then comes back and
the flood drains), and each flooded block is compared with the calm ones on either side
of it, so that a machine whose load changes meanwhile weighs on both alike.
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
#: flooded blocks of WAVES waves, each between two calm ones: short blocks, so that a
#: change of the machine's load weighs on both (the test takes 6-15 s per database)
BLOCKS = 5
WAVES = 3
FLOOD = 20
#: how long a failing run waits on the downstream before it raises (its timeout): a
#: failure that holds a handler thread, as a success would
DOWNSTREAM_TIMEOUT = 0.1


class Handlers:
    """The handler of both groups: the healthy messages' handling time on the database
    clock, by offset; partition "bad" fails while the downstream is down."""

    def __init__(self) -> None:
        self.at: dict[int, int] = {}
        self.failures = 0  # failing runs begun
        self.bad_acked: set[int] = set()
        self.down = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        if message.partition_key == "bad":
            if self.down.is_set():
                with self.lock:
                    self.failures += 1
                # The downstream's timeout (the workload's, not a wait of the test's).
                threading.Event().wait(DOWNSTREAM_TIMEOUT)
                raise RuntimeError("the downstream service is down")
            with self.lock:
                self.bad_acked.add(message.offset)
            return
        with connection.cursor() as cursor:
            now = storage.store(connection).database_now_ms(cursor)
        with self.lock:
            self.at[message.offset] = now


def created_at(offsets: list[int]) -> dict[int, int]:
    """When the database stamped these messages (read before garbage collection may
    delete them, once handled)."""
    return dict(QueueMessage.objects.filter(offset__in=offsets)
                .values_list("offset", "created_at"))


def healthy_waves(runner: Runner, handlers: Handlers, waves: int) -> list[int]:
    """Waves of healthy messages (both groups), each handled before the next is sent:
    their latencies."""
    created: dict[int, int] = {}
    for wave in range(waves):
        sent = [*send_messages("t", [OutgoingMessage(wave, partition_key=p) for p in HEALTHY]),
                *send_messages("u", [OutgoingMessage(wave, partition_key=p)
                                     for p in HEALTHY[:2]])]
        created.update(created_at([s.offset for s in sent]))
        run_until(runner, lambda sent=sent: all(s.offset in handlers.at for s in sent))
    return [handlers.at[o] - at for o, at in created.items()]


def flood_on(runner: Runner, handlers: Handlers) -> list[int]:
    """The downstream goes down and FLOOD messages of partition "bad" fail, again and
    again: on once each has failed, and so often that the partition counts as failing."""
    handlers.down.set()
    bad = [s.offset for s in send_messages(
        "t", [OutgoingMessage(n, partition_key="bad") for n in range(FLOOD)])]
    stats = runner.subscribers[0].stats
    before = stats["retried"]
    run_until(runner, lambda: stats["retried"] >= before + FLOOD)
    return bad


def flood_off(runner: Runner, handlers: Handlers, bad: list[int]) -> None:
    """The downstream is back: the flood drains."""
    handlers.down.clear()
    run_until(runner, lambda: handlers.bad_acked.issuperset(bad))


def upper_quartile(values: list[int]) -> float:
    return statistics.quantiles(values, n=4)[-1]


def ratios(calm: list[list[int]], flooded: list[list[int]], floor_ms: float,
           ) -> list[tuple[float, float]]:
    """Each flooded block's median and upper quartile over those of the calm blocks on
    either side of it (a load that rises or falls meanwhile weighs on both), or over one
    poll interval if more (what a pass costs at best)."""
    found = []
    for n, block in enumerate(flooded):
        around = calm[n] + calm[n + 1]
        found.append((statistics.median(block) / max(statistics.median(around), floor_ms),
                      upper_quartile(block) / max(upper_quartile(around), floor_ms)))
    return found


def test_healthy_partitions_keep_their_latency_beside_a_flood(register: Any) -> None:
    handlers = Handlers()
    options = {"max_attempts": 1_000_000, "min_backoff": 0.01, "max_backoff": 0.02}
    register("t", "g", handlers, **options)
    register("u", "other", handlers, **options)
    conf = fast_settings()
    runner = Runner(select_consumers(["g", "other"]), conf=conf)
    runner.start_handler_threads()
    calm: list[list[int]] = []
    flooded: list[list[int]] = []
    try:
        healthy_waves(runner, handlers, 1)  # leases taken, connections opened
        calm.append(healthy_waves(runner, handlers, WAVES))
        for _ in range(BLOCKS):
            bad = flood_on(runner, handlers)
            flooded.append(healthy_waves(runner, handlers, WAVES))
            failures = handlers.failures
            run_until(runner, lambda f=failures: handlers.failures > f)  # on all along
            flood_off(runner, handlers, bad)
            calm.append(healthy_waves(runner, handlers, WAVES))
    finally:
        runner.stop()
        runner.shutdown()
    # Within 2x: the median over the blocks of each one's ratios (a hiccup of a loaded
    # machine moves the block it falls in, whichever it is).
    found = ratios(calm, flooded, conf.POLL_INTERVAL * 1000)
    median, quartile = (statistics.median(r[n] for r in found) for n in (0, 1))
    report = (f"flooded/calm latency: median {median:.2f}x, p75 {quartile:.2f}x (by block: "
              f"{', '.join(f'{m:.2f}/{q:.2f}' for m, q in found)}; ms calm {calm}, "
              f"flooded {flooded})")
    print(report)  # shown with -s, and with a failure
    assert median <= 2 and quartile <= 2, report
