"""The history checker's workload (tests/history) on the in-memory database: the engine
driven deterministically, one seed one history.

Every choice comes from the seed: what is published (committed, rolled back, an id
twice, or committed late: its row held back while later offsets are read, the store's
write horizon showing its transaction open), what each handler does (ack, fail, run
slow, outlive its visibility timeout, or die with its runner mid-run), which of two
runners takes the next step (a pass, or running the handlers it handed out), when the
clock jumps, and when a runner is killed (dropped without a shutdown) or stopped
gracefully (its leases released), and later replaced. A handler of the ordered group
``h-frozen`` may freeze its runner past its lease while it runs (the runner is not
stepped; the other one is, takes the partition, and a message held back below the frozen
run commits meanwhile): the new holder must start nothing there before the frozen run's
visibility timeout (issue 51). Batch consumer groups run beside the others
(``tests.engine.stepped_batches``, issue 55). A flood (issue 56, ``Flood``): for a while
every message of one partition of one group fails (a plain exception or ``Reject``), then
it recovers. The runners' lease events are recorded
(``tests.history.lease_log``, on the manual clock). The same seed gives the same history
(``SQLQUEUE_HISTORY_SEED`` replays one); ``tests.history.checker`` checks it.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from sqlqueue import Message, Reject, send_message
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from tests.engine import stepped_batches
from tests.engine.harness import ALIASES, MemoryQueue, SteppedRunner
from tests.engine.memory.tables import StoredMessage
from tests.history import lease_log
from tests.history.batch_workload import ATOMIC_OUT, BATCH_GROUPS
from tests.history.model import DeadLetter, Fault, FinalState, GroupConfig, History, Publish, Run
from tests.history.workload import (
    FLOOD_GROUPS,
    FROZEN_GROUP,
    GROUPS,
    MAX_ATTEMPTS,
    MAX_BACKOFF_S,
    MIN_BACKOFF_S,
    PARTITIONS,
    TOPIC,
    Flood,
)

# The real-database workload's topic, partitions, groups and retry settings.
MIN_BACKOFF_MS, MAX_BACKOFF_MS = round(MIN_BACKOFF_S * 1000), round(MAX_BACKOFF_S * 1000)
VISIBILITY_MS = 1_000
#: a live runner is stepped at least this often (clock ms); a dead one is replaced after
CADENCE_MS, RESTART_AFTER_MS = 300, 2_000
#: the alias publishers use (runners use ``ALIASES``, one each)
PUBLISHER_ALIAS = ALIASES[0]
#: FROZEN_GROUP's visibility timeout outlasts a freeze (a lease, and two seconds more:
#: long enough for the other runner to take the partition while the run is in flight)
FREEZE_MS, FROZEN_VISIBILITY_MS = 6_000, 8_000
#: every group the stepped workload runs (the batch groups: ``stepped_batches``)
STEPPED_GROUPS = {**GROUPS, FROZEN_GROUP: {"ordered": True}, **BATCH_GROUPS}


@dataclass(frozen=True)
class Shape:
    messages: int = 40
    #: chance, at each action, that a runner is killed; that everything pauses
    kill_chance: float = 0.01
    pause_chance: float = 0.005
    #: chance that a runner stops gracefully (SIGTERM: outcomes recorded, leases
    #: released, their rows deleted) and is started again later
    stop_chance: float = 0.005
    #: the most steps of the run before the drain (which only steps runners)
    drain_steps: int = 4_000
    #: a group's limits (``rate_limit``, ``max_in_flight``), stepped on the clock too
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: chance that a publish commits late, and after how many actions
    late_chance: float = 0.15
    late_actions: tuple[int, int] = (5, 60)
    #: chance that a first attempt of FROZEN_GROUP freezes its runner (always, when a
    #: message held back below it waits in its partition: the issue-51 case)
    freeze_chance: float = 0.05
    #: run the batch consumer groups (``stepped_batches``) beside the others
    batch_groups: bool = True
    #: a flood (``Flood``): when it begins after the run, and how long it lasts (clock ms)
    flood_starts_ms: tuple[float, float] = (0, 3_000)
    flood_lasts_ms: tuple[float, float] = (1_000, 4_000)



@dataclass
class Late:
    """A publish whose transaction stays open: its row, held back until ``due``."""

    row: StoredMessage
    begun: float
    due: int


class Killed(KeyboardInterrupt):
    """A handler's runner dies under it (raised through ``InlinePool``, as ^C is)."""


@dataclass
class Slot:
    """A runner's place: the runner now living there, and since when it is dead."""

    alias: str
    index: int
    runner: SteppedRunner | None = None
    lives: int = 0
    dead_since: float | None = None
    stepped_at: float = 0.0


class SteppedWorkload:
    def __init__(self, seed: int, queue: MemoryQueue, shape: Shape = Shape()) -> None:
        self.seed, self.queue, self.shape = seed, queue, shape
        self.random = random.Random(seed)
        self.groups = STEPPED_GROUPS if shape.batch_groups else {
            g: o for g, o in STEPPED_GROUPS.items() if g not in BATCH_GROUPS}
        self.history = History(TOPIC, {
            group: GroupConfig(ordered=bool(options.get("ordered")), max_attempts=MAX_ATTEMPTS,
                               min_backoff_ms=MIN_BACKOFF_MS, max_backoff_ms=MAX_BACKOFF_MS,
                               visibility_ms=visibility_ms(group))
            for group, options in self.groups.items()}, seed=seed,
            lease_ms=round(queue.settings().LEASE_DURATION * 1000),
            renew_ms=round(queue.settings().LEASE_RENEW_INTERVAL * 1000))
        self.slots = [Slot(alias, n) for n, alias in enumerate(ALIASES)]
        self.stepping: Slot | None = None
        self.published = 0
        self.actions = 0
        self.late: list[Late] = []
        self.frozen: Slot | None = None
        queue.database.open_writers = {}
        self.flood = Flood.of(seed, FLOOD_GROUPS, shape.flood_starts_ms, shape.flood_lasts_ms)
        self.began = self.now

    @property
    def now(self) -> float:
        return float(self.queue.clock.ms)

    # -- the handlers ------------------------------------------------------------------------
    def behaviour(self, group: str, message_id: str, attempt: int) -> tuple[str, int]:
        """What the handler does for this attempt, and for how many clock ms."""
        rng = random.Random(zlib.crc32(f"{self.seed}/{group}/{message_id}/{attempt}".encode()))
        roll = rng.random()
        if group == FROZEN_GROUP:
            return ("freeze", FREEZE_MS) if (
                roll < self.shape.freeze_chance and attempt == 1) else ("quick", 0)
        if roll < 0.12:
            return "fail", rng.randrange(0, 50)
        if roll < 0.14 and attempt == 1:
            return "outlive", VISIBILITY_MS + rng.randrange(200, 500)
        if roll < 0.16:
            return "die", rng.randrange(0, 100)
        if roll < 0.30:
            return "slow", rng.randrange(50, 300)
        return "quick", 0

    def handler(self, group: str) -> Callable[[Message], None]:
        def handle(message: Message) -> None:
            slot = self.stepping
            assert slot is not None and slot.runner is not None
            started, name = self.now, slot.runner.name
            visible_until = self._visible_until(group, message)
            what, busy_ms = self.behaviour(group, message.id, message.attempt)
            if group == FROZEN_GROUP and message.attempt == 1 and any(
                    late.row.partition_key == message.partition_key
                    and late.row.offset < message.offset for late in self.late):
                what, busy_ms = "freeze", FREEZE_MS
            if self.flood.on(group, message.partition_key, self.now - self.began):
                what, busy_ms = f"flood-{self.flood.kind}", self.random_of(message, 20)
            if what == "freeze":
                self.freeze(slot, busy_ms)
            else:
                self.queue.clock.advance(busy_ms)

            def ran(outcome: str, finished: float | None) -> None:
                self.history.ran(Run(group, TOPIC, message.partition_key, message.offset,
                                     message.id, message.attempt, name, started, finished,
                                     outcome, visible_until_ms=visible_until))  # type: ignore[arg-type]

            if what == "die":
                ran("cut", None)
                raise Killed(name)
            if what in ("fail", "flood-fail"):
                ran("fail", self.now)
                raise RuntimeError(f"{message.id} fails attempt {message.attempt}")
            if what == "flood-reject":
                ran("reject", self.now)
                raise Reject(f"{message.id}: the downstream refuses it")
            if group == "h-atomic":
                # Its own write, committed with the ack or not at all (guarantee I13).
                send_message(TOPIC + ".out", message.id, partition_key=message.partition_key,
                             using=slot.alias)
                finished = self.now
                transaction.on_commit(lambda: ran("ok", finished), using=slot.alias)
            else:
                ran("ok", self.now)

        return handle

    def random_of(self, message: Message, below: int) -> int:
        """A number below ``below`` for this delivery, from the seed."""
        return random.Random(zlib.crc32(
            f"{self.seed}/{message.id}/{message.attempt}".encode())).randrange(below)

    def _visible_until(self, group: str, message: Message) -> float | None:
        """This delivery's visibility deadline, as its state row says now."""
        state = self.queue.tables.states.get((group, TOPIC, message.partition_key,
                                              message.offset))
        if state is None or state.acked:
            return None
        if state.retry_count != message.attempt - 1:
            return 0.0  # marked again since: its timeout had run out already
        return float(state.invisible_until)

    def freeze(self, slot: Slot, milliseconds: int) -> None:
        """``slot``'s runner stops (SIGSTOP, a VM pause) for ``milliseconds`` while this
        handler of it runs on: the other runner is stepped meanwhile, and once the frozen
        one's lease ran out, what was held back commits (the issue-51 case: the new
        holder finds it below the frozen run). Nothing happens (a quick run) while
        another freeze is under way or nobody else could take over."""
        others = [s for s in self.slots if s is not slot and s.runner is not None]
        if self.frozen is not None or not others:
            return
        began, self.frozen = self.now, slot
        try:
            while self.now - began < milliseconds:
                self.queue.clock.advance(CADENCE_MS)
                if self.now - began > milliseconds * 2 // 3:
                    self.commit_late(everything=True)
                for other in others:
                    self.step(other, run_handlers=False)
                    self.step(other, run_handlers=True)
        finally:
            self.frozen, self.stepping = None, slot
        assert slot.runner is not None
        self.history.faulted(Fault("pause", began, self.now, slot.runner.name))

    # -- the publishers ----------------------------------------------------------------------
    def publish(self) -> None:
        n = self.published
        self.published += 1
        message_id, partition = f"m{n}", self.random.choice(PARTITIONS)
        roll = self.random.random()
        if 0.10 <= roll < 0.10 + self.shape.late_chance:
            self._publish_late(message_id, partition)
            return
        self._publish(message_id, partition, rollback=roll < 0.10)
        if roll > 0.9:  # the same id again: stored once, at the first's offset
            self._publish(message_id, partition)

    def _publish(self, message_id: str, partition: str, *, rollback: bool = False) -> None:
        begun, offset, created = self.now, None, True
        try:
            with transaction.atomic(using=PUBLISHER_ALIAS):
                sent = send_message(TOPIC, message_id, partition_key=partition, id=message_id,
                                    using=PUBLISHER_ALIAS)
                offset, created = sent.offset, sent.created
                self.queue.clock.advance(self.random.randrange(0, 20))
                commit_begun = self.now
                if rollback:
                    raise _RolledBack
        except _RolledBack:
            pass
        self.queue.clock.advance(self.random.randrange(0, 5))
        self.history.published(Publish("publisher", TOPIC, partition, message_id, offset,
                                       begun, commit_begun, self.now, not rollback, created))

    def _publish_late(self, message_id: str, partition: str) -> None:
        """Insert, and hold the row back (its transaction left open) for a few actions:
        later offsets are read meanwhile; the store's write horizon shows it open."""
        begun = self.now
        with transaction.atomic(using=PUBLISHER_ALIAS):
            sent = send_message(TOPIC, message_id, partition_key=partition, id=message_id,
                                using=PUBLISHER_ALIAS)
            tables = self.queue.tables
            row = tables.messages.pop(sent.offset)
            del tables.message_ids[(TOPIC, partition, message_id)]
        assert self.queue.database.open_writers is not None
        self.queue.database.open_writers[row.offset] = row.created_at
        self.late.append(Late(row, begun, self.actions + self.random.randrange(
            *self.shape.late_actions)))

    def commit_late(self, *, everything: bool = False) -> None:
        """Commit the late publishes due (all of them: ``everything``)."""
        tables, writers = self.queue.tables, self.queue.database.open_writers
        assert writers is not None
        for late in [late for late in self.late if everything or late.due <= self.actions]:
            self.late.remove(late)
            commit_begun = self.now
            row = late.row
            rows = sorted([*tables.messages.items(), (row.offset, row)])
            tables.messages.clear()
            tables.messages.update(rows)  # in offset order, as the log is read
            tables.message_ids[(TOPIC, row.partition_key, row.id)] = row.offset
            del writers[row.offset]
            self.history.published(Publish("publisher", TOPIC, row.partition_key, row.id,
                                           row.offset, late.begun, commit_begun, self.now,
                                           True, True))

    # -- the runners -------------------------------------------------------------------------
    def start(self, slot: Slot) -> None:
        slot.lives += 1
        slot.runner = self.queue.runner(
            select_consumers(list(self.groups), [TOPIC]), alias=slot.alias,
            name=f"runner-{slot.index}.{slot.lives}")
        slot.dead_since, slot.stepped_at = None, self.now

    def stop(self, slot: Slot) -> None:
        """SIGTERM: what its handlers did is recorded, what they did not start is given
        back, and its leases are released for the other runner to take. Not a fault:
        nothing it did may be run again."""
        assert slot.runner is not None
        slot.runner.stop_gracefully()
        slot.runner, slot.dead_since = None, self.now

    def kill(self, slot: Slot) -> None:
        assert slot.runner is not None
        slot.runner.kill()
        self.history.faulted(Fault("kill", self.now, self.now, slot.runner.name))
        slot.runner, slot.dead_since = None, self.now

    def step(self, slot: Slot, *, run_handlers: bool) -> None:
        """A pass of ``slot``'s runner, or the handlers it handed out (nothing if a
        handler killed it meanwhile)."""
        if slot.runner is None:
            return
        self.stepping = slot
        slot.stepped_at = began = self.now
        name = slot.runner.name
        try:
            if run_handlers:
                slot.runner.pool.run_handed_out()
            else:
                slot.runner.run_once()
        except Killed:
            self.kill(slot)
        finally:
            self.stepping = None
            if run_handlers and self.now - began > CADENCE_MS and slot.runner is not None:
                # Its handlers ran inline, one after another, for longer than a step:
                # its loop stood still meanwhile (threads would have run them beside
                # it). Not a fault that excuses a redelivery or an overlap; it tells
                # the lease rule (I12) this runner could not take a partition then.
                self.history.faulted(Fault("stall", began, self.now, name))

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> History:
        for group, options in self.groups.items():
            if group in BATCH_GROUPS:
                continue
            consumer(TOPIC, group=group, max_attempts=MAX_ATTEMPTS,
                     min_backoff=MIN_BACKOFF_MS / 1000, max_backoff=MAX_BACKOFF_MS / 1000,
                     visibility_timeout=visibility_ms(group) / 1000,
                     ordered=options.get("ordered", False),
                     atomic=options.get("atomic", False),
                     **self.shape.limits.get(group, {}))(self.handler(group))
        if self.shape.batch_groups:
            stepped_batches.register(self, {
                "max_attempts": MAX_ATTEMPTS, "min_backoff": MIN_BACKOFF_MS / 1000,
                "max_backoff": MAX_BACKOFF_MS / 1000,
                "visibility_timeout": VISIBILITY_MS / 1000})
        try:
            with lease_log.recording(self.history, lambda: self.now):
                for slot in self.slots:
                    self.start(slot)
                while self.published < self.shape.messages:
                    self.act()
                self.commit_late(everything=True)
                self.drain()
        finally:
            for group in self.groups:
                unregister(group, TOPIC)
        self.history.final = self.final_state()
        return self.history

    def act(self) -> None:
        """One seeded action: a publish, a step of a runner, a kill, a restart, or a
        pause of everything; then every runner left unstepped for ``CADENCE_MS`` steps
        (a runner's loop passes every poll: it only stalls when paused, a fault)."""
        self.queue.clock.advance(self.random.choice((0, 5, 20, 50, 100)))
        self.actions += 1
        self.commit_late()
        roll = self.random.random()
        slot = self.random.choice(self.slots)
        if roll < 0.3:
            self.publish()
        elif slot.runner is None:
            if self.now - (slot.dead_since or 0.0) >= RESTART_AFTER_MS:
                self.start(slot)
        elif roll < 0.3 + self.shape.kill_chance:
            self.kill(slot)
        elif roll < 0.3 + self.shape.kill_chance + self.shape.pause_chance:
            self.pause_everything(self.random.randrange(2_000, 6_000))
        elif roll < (0.3 + self.shape.kill_chance + self.shape.pause_chance
                     + self.shape.stop_chance):
            self.stop(slot)
        else:
            # Handlers sometimes start only after another action (busy threads).
            self.step(slot, run_handlers=False)
            if self.random.random() < 0.7:
                self.step(slot, run_handlers=True)
        for other in self.slots:
            if other.runner is not None and self.now - other.stepped_at >= CADENCE_MS:
                self.step(other, run_handlers=True)
                self.step(other, run_handlers=False)

    def pause_everything(self, milliseconds: int) -> None:
        """The machine stops (a VM frozen): leases and visibility timeouts run out."""
        began = self.now
        self.queue.clock.advance(milliseconds)
        for slot in self.slots:
            if slot.runner is not None:
                self.history.faulted(Fault("pause", began, self.now, slot.runner.name))

    def drain(self) -> None:
        """Every runner alive, stepped in turn, until every message is done; then each
        stops gracefully."""
        for _ in range(self.shape.drain_steps):
            if not self.undone():
                break
            for slot in self.slots:
                if slot.runner is None:  # a handler may still kill its runner
                    self.start(slot)
                for run_handlers in (False, True):
                    if slot.runner is not None:
                        self.step(slot, run_handlers=run_handlers)
            self.queue.clock.advance(100)
        for slot in self.slots:
            if slot.runner is not None:
                self.stepping = slot
                slot.runner.pool.run_handed_out()
                slot.runner.stop_gracefully()

    def undone(self) -> list[tuple[str, str]]:
        done = {(d.group, d.id) for d in self.dead_letters()}
        done |= {(r.group, r.id) for r in self.history.runs if r.outcome == "ok"}
        return [(group, p.id) for p in self.history.publishes if p.committed and p.created
                for group in self.groups if (group, p.id) not in done]

    # -- what the database holds at the end ----------------------------------------------------
    def dead_letters(self) -> list[DeadLetter]:
        return [DeadLetter(m.consumer_group, str(json.loads(m.failure_detail or "{}")["id"]),
                           m.failure_count, m.last_error)
                for m in self.queue.tables.messages.values() if m.topic == TOPIC + "_dlq"]

    def final_state(self) -> FinalState:
        t = self.queue.tables
        stored = {(m.partition_key, m.offset): m.id for m in t.messages.values()
                  if m.topic == TOPIC}
        acked = {(g, p, o) for (g, topic, p, o), state in t.states.items()
                 if topic == TOPIC and state.acked}
        for (group, topic, partition), row in t.watermarks.items():
            if topic == TOPIC:
                acked |= {(group, p, o) for (p, o) in stored
                          if p == partition and o <= row.offset_acked}
        written = {json.loads(m.payload) for m in t.messages.values()
                   if m.topic == TOPIC + ".out"}
        batch_written = {json.loads(m.payload) for m in t.messages.values()
                         if m.topic == TOPIC + ATOMIC_OUT}
        return FinalState(acked=acked, stored=stored, dead_letters=self.dead_letters(),
                          collectable=True, atomic_writes={"h-atomic": written,
                                                           "hb-atomic": batch_written})


def visibility_ms(group: str) -> int:
    return FROZEN_VISIBILITY_MS if group == FROZEN_GROUP else VISIBILITY_MS


class _RolledBack(Exception):
    pass
