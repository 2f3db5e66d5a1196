"""A seeded, randomized workload in one process that records its history.

Publishers commit at once, late (holding their transaction open after the INSERT), roll
back, or publish an id twice; handlers are quick, slow, fail, or outlive their visibility
timeout; on a database server a staller holds the queue's rows locked now and then; two
runners (``Runner`` on threads, as ``runconsumer`` runs it) share the partitions, and now
and then a handler of the ordered group ``h-frozen`` freezes its runner (its loop stops,
as a SIGSTOP, a VM pause would stop it) for longer than a lease while the handler runs on
inside its visibility timeout: the other runner takes the partition and must start
nothing there before that run's timeout (issue 51). Batch consumer groups run beside them
(``tests.history.batch_workload``: unordered, ordered, ordered and atomic; issue 55). A
flood (issue 56): for a while every message of one partition of one group fails, with a
plain exception or ``Reject`` (a downstream down, a bad deploy), then it recovers.
The runners' lease events are recorded too (``tests.history.lease_log``). Every choice
comes from the seed, so a failing run is run again with ``SQLQUEUE_HISTORY_SEED``.
The history is checked by ``tests.history.checker`` (real processes, kills and restarts
are ``bench/soak.py``'s: ``make soak``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, connections, transaction

from sqlqueue import Message, Reject, send_message
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from sqlqueue.consuming.runner import Runner
from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from tests.history import batch_workload, lease_log
from tests.history.model import (
    DeadLetter,
    Fault,
    FinalState,
    GroupConfig,
    History,
    Publish,
    Run,
    now_ms,
)

TOPIC = "history.t"
PARTITIONS = ("p0", "p1", "p2", "p3")


@dataclass(frozen=True)
class Shape:
    """How big and how hostile a run is."""

    messages_per_publisher: int = 60
    publishers: int = 2
    runners: int = 2
    threads: int = 3
    late_commit_s: tuple[float, float] = (0.1, 0.6)
    stalls: bool = True
    stall_s: tuple[float, float] = (0.3, 1.2)
    visibility_s: float = 1.0
    #: atomic handlers sleep inside their transaction (slow, outliving their timeout);
    #: not on SQLite, where that transaction holds the one write lock and stops everyone
    atomic_sleeps: bool = True
    drain_timeout_s: float = 120.0
    #: how many handlers of FROZEN_GROUP freeze their runner past its lease (one at a
    #: time; none with one runner: nobody to take over)
    freezes: int = 1
    #: how long past the lease (LEASE_DURATION of ``settings_for``) a freeze lasts
    freeze_past_lease_s: float = 1.0
    #: a flood (``Flood``): when it begins after the first run of its partition (of its
    #: group: a loaded machine may take seconds to start the runners), how long it lasts.
    #: It begins with that first run: a later start found no run of a partition whose
    #: messages had all been handled by then (seed 101), and the test wants a flood
    flood_starts_s: tuple[float, float] = (0.0, 0.0)
    flood_lasts_s: tuple[float, float] = (1.0, 2.5)


GROUPS: dict[str, dict[str, Any]] = {
    "h-any": {},
    "h-ordered": {"ordered": True},
    "h-atomic": {"atomic": True},
}
#: ordered, its visibility timeout longer than a freeze: a frozen holder's run is still in
#: flight, and inside its timeout, when the other runner takes its partition
FROZEN_GROUP = "h-frozen"
FROZEN_VISIBILITY_S = 7.0
MAX_ATTEMPTS = 3
MIN_BACKOFF_S = 0.05
MAX_BACKOFF_S = 0.2
#: the groups one of which floods (not FROZEN_GROUP: its runs freeze runners)
FLOOD_GROUPS = ("h-any", "h-ordered", "h-atomic")


@dataclass(frozen=True)
class Flood:
    """For a while every message of one partition of one group fails: ``kind`` "fail"
    (a plain exception: retried with backoff, dead-lettered after MAX_ATTEMPTS) or
    "reject" (dead-lettered at once); then the downstream is back. Chosen from the seed
    (``of``); ``began`` and ``ends`` are after a start, in the workload's unit (here
    seconds after the partition's first run; the stepped workload's: clock milliseconds
    after the run began)."""

    group: str
    partition: str
    kind: str
    began: float
    ends: float

    @classmethod
    def of(cls, seed: int, groups: tuple[str, ...], starts: tuple[float, float],
           lasts: tuple[float, float]) -> Flood:
        rng = random.Random(f"{seed}/flood")  # the other choices stay the seed's
        began = rng.uniform(*starts)
        return cls(rng.choice(groups), rng.choice(PARTITIONS), rng.choice(("fail", "reject")),
                   began, began + rng.uniform(*lasts))

    def on(self, group: str, partition: str, elapsed: float) -> bool:
        return (group, partition) == (self.group, self.partition) and (
            self.began <= elapsed < self.ends)


class Workload:
    def __init__(self, seed: int, shape: Shape, conf: QueueSettings) -> None:
        self.seed = seed
        self.shape = shape
        self.conf = conf
        self.random = random.Random(seed)
        self.groups = {**GROUPS, FROZEN_GROUP: {"ordered": True}} if (
            shape.freezes and shape.runners > 1) else dict(GROUPS)
        self.groups.update(batch_workload.BATCH_GROUPS)
        self.history = History(TOPIC, {
            group: GroupConfig(ordered=bool(options.get("ordered")), max_attempts=MAX_ATTEMPTS,
                               min_backoff_ms=round(MIN_BACKOFF_S * 1000),
                               max_backoff_ms=round(MAX_BACKOFF_S * 1000),
                               visibility_ms=round(self.visibility_s(group) * 1000))
            for group, options in self.groups.items()}, seed=seed,
            lease_ms=round(conf.LEASE_DURATION * 1000),
            renew_ms=round(conf.LEASE_RENEW_INTERVAL * 1000))
        self.server_database = connection.vendor != "sqlite"
        self.stop_stalling = threading.Event()
        self.runners: list[Runner] = []
        #: the runners' loops, each open unless its runner is frozen
        self.gates: dict[str, threading.Event] = {}
        self.freezes_left = shape.freezes
        self._freezing = threading.Lock()
        self.flood = Flood.of(seed, FLOOD_GROUPS, shape.flood_starts_s, shape.flood_lasts_s)
        self.flood_since: float | None = None  # its partition's first run (monotonic)

    def visibility_s(self, group: str) -> float:
        return FROZEN_VISIBILITY_S if group == FROZEN_GROUP else self.shape.visibility_s

    # -- the handlers ------------------------------------------------------------------------
    def behaviour(self, group: str, message_id: str, attempt: int) -> tuple[str, float]:
        """What the handler does for this attempt (the same for the same seed)."""
        rng = random.Random(zlib.crc32(f"{self.seed}/{group}/{message_id}/{attempt}".encode()))
        roll = rng.random()
        if group == FROZEN_GROUP:
            return ("freeze", self.conf.LEASE_DURATION + self.shape.freeze_past_lease_s) if (
                roll < 0.1 and attempt == 1) else ("quick", 0.0)
        if roll < 0.12:
            return "fail", rng.uniform(0.0, 0.05)
        if roll < 0.14 and attempt == 1:
            return "outlive", self.shape.visibility_s + rng.uniform(0.2, 0.5)
        if roll < 0.30:
            return "slow", rng.uniform(0.05, 0.3)
        return "quick", 0.0

    def handler(self, group: str) -> Callable[[Message], None]:
        def handle(message: Message) -> None:
            started = now_ms()
            visible_until = _visible_until(group, message)
            what, seconds = self.behaviour(group, message.id, message.attempt)
            if self.flood.on(group, message.partition_key, self._since_flood_began(
                    group, message.partition_key)):
                what, seconds = f"flood-{self.flood.kind}", 0.0
            outcome = "ok"
            runner = threading.current_thread().name.rpartition("@")[2]
            try:
                if what == "freeze":
                    self.freeze(runner, seconds)
                elif group != "h-atomic" or self.shape.atomic_sleeps:
                    time.sleep(seconds)
                if what in ("fail", "flood-fail"):
                    outcome = "fail"
                    raise RuntimeError(f"{message.id} fails attempt {message.attempt}")
                if what == "flood-reject":
                    outcome = "reject"
                    raise Reject(f"{message.id}: the downstream refuses it")
                if group == "h-atomic":
                    # A write of the handler's own, committed with the ack (or not at all).
                    send_message(TOPIC + ".out", message.id, partition_key=message.partition_key)
            finally:
                def record() -> None:
                    self.history.ran(Run(
                        group, TOPIC, message.partition_key, message.offset, message.id,
                        message.attempt, runner, started, now_ms(),
                        outcome, visible_until_ms=visible_until))  # type: ignore[arg-type]

                if group == "h-atomic" and outcome == "ok":
                    # Done when its transaction (the ack in it) commits, which may wait.
                    transaction.on_commit(record)
                else:
                    record()

        return handle

    def _since_flood_began(self, group: str, partition: str) -> float:
        """Seconds since the first run of the flood's partition (-1 for another)."""
        if (group, partition) != (self.flood.group, self.flood.partition):
            return -1.0
        with self._freezing:
            if self.flood_since is None:
                self.flood_since = time.monotonic()
            return time.monotonic() - self.flood_since

    def freeze(self, runner: str, seconds: float) -> None:
        """Freeze ``runner``'s loop for ``seconds`` (no renewal, no fence, nothing
        delivered or recorded: a SIGSTOP of its main thread) while this handler runs on,
        and half a second more; one freeze at a time, ``Shape.freezes`` in all (after
        that, or while another runner is frozen, the handler is quick)."""
        with self._freezing:
            gate = self.gates.get(runner)
            frozen = gate is not None and self.freezes_left > 0 and all(
                g.is_set() for g in self.gates.values())
            if frozen:
                self.freezes_left -= 1
                gate.clear()  # type: ignore[union-attr]
        if not frozen:
            return  # quick instead
        began = now_ms()
        time.sleep(seconds)
        gate.set()  # type: ignore[union-attr]
        self.history.faulted(Fault("pause", began, now_ms(), runner))
        time.sleep(0.5)

    def gated(self, runner: Runner) -> Runner:
        """``runner`` with a gate its loop waits at before each pass (``freeze``)."""
        gate = self.gates[runner.name] = threading.Event()
        gate.set()
        cycle = runner._cycle

        def frozen_between_passes() -> float | None:
            while not gate.wait(0.05):
                if runner.stopping.is_set():
                    break
            return cycle()

        runner._cycle = frozen_between_passes  # type: ignore[method-assign]
        return runner

    # -- the publishers ----------------------------------------------------------------------
    def publish_all(self, name: str, rng: random.Random) -> None:
        try:
            for n in range(self.shape.messages_per_publisher):
                message_id = f"{name}-{n}"
                partition = rng.choice(PARTITIONS)
                roll = rng.random()
                if roll < 0.10:
                    self._publish(name, message_id, partition, rollback=True)
                elif roll < 0.25:
                    self._publish(name, message_id, partition,
                                  hold=rng.uniform(*self._late_commit()))
                else:
                    self._publish(name, message_id, partition)
                if roll > 0.9:  # the same id again: stored once, the first's offset
                    self._publish(name, message_id, partition)
                time.sleep(rng.uniform(0.0, 0.03))
        finally:
            connections.close_all()

    def _late_commit(self) -> tuple[float, float]:
        # SQLite's one writer: a transaction held open stops every runner's writes too.
        return self.shape.late_commit_s if self.server_database else (0.05, 0.15)

    def _publish(self, name: str, message_id: str, partition: str, *, hold: float = 0.0,
                 rollback: bool = False) -> None:
        for _ in range(20):  # a deadlock or a lock wait given up: the same id again
            begun = now_ms()
            offset, created = None, True
            try:
                with transaction.atomic():
                    sent = send_message(TOPIC, message_id, partition_key=partition,
                                        id=message_id)
                    offset, created = sent.offset, sent.created
                    time.sleep(hold)
                    commit_begun = now_ms()
                    if rollback:
                        raise _RolledBack
            except _RolledBack:
                self.history.published(Publish(name, TOPIC, partition, message_id, offset,
                                               begun, commit_begun, now_ms(), False, created))
                return
            except DatabaseError:
                connection.close()
                continue
            self.history.published(Publish(name, TOPIC, partition, message_id, offset, begun,
                                           commit_begun, now_ms(), True, created))
            return
        raise AssertionError(f"{name} could not publish {message_id}")

    # -- lock stalls -------------------------------------------------------------------------
    def stall_now_and_then(self, rng: random.Random) -> None:
        """Hold every lease and delivery-state row locked for a while, again and again
        (another program's long transaction, a backup's lock)."""
        try:
            while not self.stop_stalling.wait(rng.uniform(0.5, 1.5)):
                seconds = rng.uniform(*self.shape.stall_s)
                began = now_ms()
                with contextlib.suppress(DatabaseError), transaction.atomic():
                    list(DeliveryState.objects.select_for_update().filter(topic=TOPIC))
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT 1 FROM queue_partition_leases FOR UPDATE")
                    time.sleep(seconds)
                self.history.faulted(Fault("stall", began, now_ms()))
        finally:
            connections.close_all()

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> History:
        with registered(self), lease_log.recording(self.history):
            self.runners = runners = [self.gated(
                Runner(select_consumers(list(self.groups), [TOPIC]), conf=self.conf,
                       threads=self.shape.threads, name=f"runner-{n}"))
                for n in range(self.shape.runners)]
            threads = [_thread(lambda r=r: r.run(install_signal_handlers=False))
                       for r in runners]
            publishers = [_thread(lambda n=n: self.publish_all(
                f"pub{n}", random.Random(self.random.random())))
                for n in range(self.shape.publishers)]
            staller = _thread(lambda: self.stall_now_and_then(
                random.Random(self.random.random()))) if (
                self.shape.stalls and self.server_database) else None
            for publisher in publishers:
                publisher.join()
            self.stop_stalling.set()
            if staller is not None:
                staller.join()
            try:
                self._wait_until_done()
            finally:
                for runner in runners:
                    runner.stop()
                for thread in threads:
                    thread.join(60)
        self.history.final = final_state(self.history)
        return self.history

    def _wait_until_done(self) -> None:
        deadline = time.monotonic() + self.shape.drain_timeout_s
        while time.monotonic() < deadline:
            if not undone(self.history):
                return
            time.sleep(0.2)


class _RolledBack(Exception):
    pass


def undone(history: History) -> list[tuple[str, str]]:
    """(group, id) of committed messages not yet handled well nor dead-lettered."""
    done = {(d.group, d.id) for d in _dead_letters(history.topic)}
    done |= {(r.group, r.id) for r in list(history.runs) if r.outcome == "ok"}
    return [(group, p.id) for p in list(history.publishes) if p.committed and p.created
            for group in history.groups if (group, p.id) not in done]


def _visible_until(group: str, message: Message) -> float | None:
    """This delivery's visibility deadline, read from its state row on a connection of
    the reader's own (a handler's transaction must not see, nor lock, anything more)."""
    reader = connections.create_connection("default")
    try:
        with reader.cursor() as cursor:
            cursor.execute(
                "SELECT invisible_until, retry_count FROM queue_delivery_state WHERE "
                "consumer_group = %s AND topic = %s AND partition_key = %s AND "
                "message_offset = %s",
                [group, message.topic, message.partition_key, message.offset])
            row = cursor.fetchone()
    finally:
        reader.close()
    if not row or not row[0]:
        return None  # acked already (an atomic handler's own ack)
    if int(row[1]) != message.attempt - 1:
        return 0.0  # marked again since: this delivery's timeout had run out already
    return float(row[0])


def _dead_letters(topic: str = TOPIC) -> list[DeadLetter]:
    rows = QueueMessage.objects.filter(topic=topic + "_dlq").values_list(
        "consumer_group", "failure_detail", "failure_count", "last_error")
    return [DeadLetter(group, str((detail or {}).get("id")), int(count), error)
            for group, detail, count, error in rows]


def final_state(history: History) -> FinalState:
    """What the database holds for ``history.topic`` now (every runner stopped): acks (in
    delivery state, or at or below a watermark), the messages still stored, dead letters."""
    topic = history.topic
    stored = {(p, o): i for p, o, i in QueueMessage.objects.filter(topic=topic).values_list(
        "partition_key", "offset", "id")}
    acked = {(g, p, o) for g, p, o in DeliveryState.objects.filter(
        topic=topic, acked=True).values_list("consumer_group", "partition_key",
                                            "message_offset")}
    for group, partition, watermark in PartitionOffset.objects.filter(topic=topic).values_list(
            "consumer_group", "partition_key", "offset_acked"):
        acked |= {(group, p, o) for (p, o) in stored if p == partition and o <= watermark}
    # The atomic group's handler publishes its message's id to TOPIC.out, in the
    # transaction that acks the message (guarantee I13).
    written = {json.loads(bytes(payload)) for payload in QueueMessage.objects.filter(
        topic=topic + ".out").values_list("payload", flat=True)}
    # Runners collect garbage as they go: a message may be gone once every group is done.
    batch_written = {json.loads(bytes(payload)) for payload in QueueMessage.objects.filter(
        topic=topic + batch_workload.ATOMIC_OUT).values_list("payload", flat=True)}
    return FinalState(acked=acked, stored=stored, dead_letters=_dead_letters(topic),
                      collectable=True, atomic_writes={"h-atomic": written,
                                                       "hb-atomic": batch_written})


@contextlib.contextmanager
def registered(workload: Workload) -> Iterator[None]:
    for group, options in workload.groups.items():
        if group in batch_workload.BATCH_GROUPS:
            continue
        consumer(TOPIC, group=group, max_attempts=MAX_ATTEMPTS, min_backoff=MIN_BACKOFF_S,
                 max_backoff=MAX_BACKOFF_S, visibility_timeout=workload.visibility_s(group),
                 **options)(workload.handler(group))
    batch_workload.register(workload, {
        "max_attempts": MAX_ATTEMPTS, "min_backoff": MIN_BACKOFF_S,
        "max_backoff": MAX_BACKOFF_S, "visibility_timeout": workload.shape.visibility_s})
    try:
        yield
    finally:
        for group in workload.groups:
            unregister(group, TOPIC)


def _thread(target: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def settings_for(conf: QueueSettings) -> QueueSettings:
    """Short intervals: leases renewed every second, polls every 20 ms."""
    return dataclasses.replace(conf, POLL_INTERVAL=0.02, LEASE_DURATION=4.0,
                               LEASE_RENEW_INTERVAL=1.0, SHUTDOWN_TIMEOUT=10)
