"""The stepped workload's batch consumer groups (issue 55): the real-database workload's
(``tests.history.batch_workload``: unordered, ordered, ordered and atomic), their calls on
the manual clock, recorded per message (``Run.batch``).

A call takes its messages' behaviours from the seed: it raises now and then (every message
fails; ordered: the first, the rest given back), or returns the failing ones in its
mapping; it lasts as long as its slowest message, outlives the visibility timeout when one
of them does, and dies with its runner (every run of it cut) when one of them would. An
atomic call's runs are cut until its transaction commits (one rolled back stays so).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from django.db import transaction

from sqlqueue import Message, send_message
from sqlqueue.consuming.registry import batch_consumer
from tests.history.batch_workload import ATOMIC_OUT, BATCH_GROUPS, outcomes, raises
from tests.history.model import Run

if TYPE_CHECKING:
    from tests.engine.stepped_workload import SteppedWorkload


def register(workload: SteppedWorkload, common: dict[str, object]) -> None:
    calls = itertools.count(1)  # the calls' names: the same for the same seed
    for group, options in BATCH_GROUPS.items():
        batch_consumer(workload.history.topic, group=group, **common,  # type: ignore[arg-type]
                       **options)(batch_handler(workload, group, calls))


def batch_handler(workload: SteppedWorkload, group: str, calls: itertools.count[int]
                  ) -> Callable[[list[Message]], Mapping[Message, BaseException] | None]:
    options = BATCH_GROUPS[group]
    ordered, atomic = bool(options.get("ordered")), bool(options.get("atomic"))

    def handle(messages: list[Message]) -> Mapping[Message, BaseException] | None:
        from tests.engine.stepped_workload import Killed

        slot = workload.stepping
        assert slot is not None and slot.runner is not None
        started, runner = workload.now, slot.runner.name
        name = f"{runner}-{next(calls)}"
        visible = {m.offset: workload._visible_until(group, m) for m in messages}
        behaviours = [workload.behaviour(group, m.id, m.attempt) for m in messages]
        dies = any(what == "die" for what, _ in behaviours)
        raised = raises(workload.seed, group, messages)
        found = outcomes(ordered, [what == "fail" for what, _ in behaviours], raised)
        workload.queue.clock.advance(max((ms for _, ms in behaviours), default=0))

        def runs(kinds: list[str], ended: float | None) -> list[Run]:
            return [Run(group, message.topic, message.partition_key, message.offset,
                        message.id, message.attempt, runner, started, ended,
                        kind,  # type: ignore[arg-type]
                        visible_until_ms=visible[message.offset], batch=name)
                    for message, kind in zip(messages, kinds, strict=True)]

        def record(recorded: list[Run]) -> None:
            for run in recorded:
                workload.history.ran(run)

        if dies:
            record(runs(["cut"] * len(messages), None))
            raise Killed(runner)
        if raised:
            record(runs(found, workload.now))
            raise RuntimeError(f"batch {name} fails ({len(messages)} messages)")
        if atomic:
            for message, outcome in zip(messages, found, strict=True):
                if outcome == "ok":  # its write commits with its ack, or not at all
                    send_message(workload.history.topic + ATOMIC_OUT, message.id,
                                 partition_key=message.partition_key, using=slot.alias)
            # Cut until its transaction commits (as the real-database workload's): one
            # rolled back after the call returned stays cut.
            cut = runs(["cut"] * len(messages), workload.now)
            record(cut)
            transaction.on_commit(
                lambda: workload.history.settled(cut, runs(found, workload.now)),
                using=slot.alias)
        else:
            record(runs(found, workload.now))
        return {m: RuntimeError(f"{m.id} fails attempt {m.attempt}")
                for m, outcome in zip(messages, found, strict=True) if outcome == "fail"}

    return handle
