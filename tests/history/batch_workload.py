"""The randomized workload's batch consumer groups (issue 55): ``@batch_consumer`` handlers
beside the single ones, recorded per message (``Run.batch``).

Three groups: unordered, ordered, and ordered and atomic (its handler's own write, one row
a message it acks, commits with the acks: I13). A call of the handler takes its messages'
behaviours from the workload's seed: one in eight calls raises (every message fails;
ordered: the first fails and the rest are given back); otherwise the messages whose
behaviour is to fail are returned in the mapping (``{message: exception}``; ordered: those
after the first failure are given back, ``uncharged``); a slow message makes the call slow;
a message that outlives its timeout makes the whole call outlive it. An atomic call's
runs are recorded ``cut`` when it returns, and settled when its transaction commits: one
rolled back after the call returned stays cut (its messages were delivered all the same:
the engine charges the first, and a message delivered again meanwhile, its next run).
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from sqlqueue import Message, send_message
from sqlqueue.consuming.registry import batch_consumer
from tests.history.model import Run, now_ms

if TYPE_CHECKING:
    from tests.history.workload import Workload

#: group -> the options of ``@batch_consumer`` beside the workload's common ones
BATCH_GROUPS: dict[str, dict[str, Any]] = {
    "hb-any": {"max_batch": 7, "max_wait": 0.05},
    "hb-ordered": {"max_batch": 5, "ordered": True},
    "hb-atomic": {"max_batch": 6, "ordered": True, "atomic": True},
}
#: the atomic batch group writes each acked message's id here, in its transaction
ATOMIC_OUT = ".bout"
FAILED = ("fail", "retry", "reject")


def raises(seed: int, group: str, messages: list[Message]) -> bool:
    """Does this call raise (the same for the same seed and batch)?"""
    first = messages[0]
    return zlib.crc32(f"{seed}/{group}/{first.id}/{first.attempt}/raise".encode()) % 8 == 0


def outcomes(ordered: bool, failing: list[bool], raised: bool) -> list[str]:
    """Each message's outcome, in the call's order: what the engine does with a raise or a
    mapping (ordered: after the first failure every message is given back, uncharged)."""
    if raised:
        return ["fail", *["uncharged"] * (len(failing) - 1)] if ordered else \
            ["fail"] * len(failing)
    found, first = [], None
    for n, fails in enumerate(failing):
        if ordered and first is not None:
            found.append("uncharged")
        elif fails:
            found.append("fail")
            first = n if first is None else first
        else:
            found.append("ok")
    return found


def batch_handler(workload: Workload, group: str, calls: itertools.count[int]
                  ) -> Callable[[list[Message]], Mapping[Message, BaseException] | None]:
    options = BATCH_GROUPS[group]
    ordered, atomic = bool(options.get("ordered")), bool(options.get("atomic"))

    def handle(messages: list[Message]) -> Mapping[Message, BaseException] | None:
        started = now_ms()
        runner = threading.current_thread().name.rpartition("@")[2]
        name = f"{runner}-{next(calls)}"
        visible = _visible_until(group, messages)
        behaviours = [workload.behaviour(group, m.id, m.attempt) for m in messages]
        raised = raises(workload.seed, group, messages)
        found = outcomes(ordered, [what == "fail" for what, _ in behaviours], raised)
        seconds = _call_seconds(workload, behaviours)
        if not atomic or workload.shape.atomic_sleeps:
            time.sleep(seconds)

        def runs(outcomes: list[str]) -> list[Run]:
            ended = now_ms()
            return [Run(group, message.topic, message.partition_key, message.offset,
                        message.id, message.attempt, runner, started, ended,
                        outcome,  # type: ignore[arg-type]
                        visible_until_ms=visible.get((message.partition_key, message.offset)),
                        batch=name)
                    for message, outcome in zip(messages, outcomes, strict=True)]

        if raised:
            for run in runs(found):
                workload.history.ran(run)
            raise RuntimeError(f"batch {name} fails ({len(messages)} messages)")
        if atomic:
            for message, outcome in zip(messages, found, strict=True):
                if outcome == "ok":  # its write commits with its ack, or not at all
                    send_message(workload.history.topic + ATOMIC_OUT, message.id,
                                 partition_key=message.partition_key)
            # Recorded now as cut: a transaction rolled back after the call returned (its
            # fenced acks found a message delivered again, a database error) leaves them
            # so, deliveries that reached the handler with no outcome of their own; its
            # commit settles them.
            cut = runs(["cut"] * len(messages))
            for run in cut:
                workload.history.ran(run)
            transaction.on_commit(lambda: workload.history.settled(cut, runs(found)))
        else:
            for run in runs(found):
                workload.history.ran(run)
        return {m: RuntimeError(f"{m.id} fails attempt {m.attempt}")
                for m, outcome in zip(messages, found, strict=True) if outcome == "fail"}

    return handle


def _call_seconds(workload: Workload, behaviours: list[tuple[str, float]]) -> float:
    """The call takes as long as its slowest message, and outlives the visibility timeout
    when one of its messages does."""
    if any(what == "outlive" for what, _ in behaviours):
        return workload.shape.visibility_s + 0.3
    return min(0.3, max((s for what, s in behaviours if what == "slow"), default=0.0))


def register(workload: Workload, common: dict[str, Any]) -> None:
    calls = itertools.count(1)  # the calls' names (with their runner's)
    for group in workload.groups:
        if group in BATCH_GROUPS:
            batch_consumer(workload.history.topic, group=group, **common,
                           **BATCH_GROUPS[group])(batch_handler(workload, group, calls))


def _visible_until(group: str, messages: list[Message]) -> dict[tuple[str, int], float]:
    """Each delivery's visibility deadline, read from its state row on a connection of the
    reader's own (as ``workload._visible_until`` does for one): 0 for one marked again
    since (its timeout had run out already), none for one acked already."""
    reader = connections.create_connection("default")
    found: dict[tuple[str, int], float] = {}
    try:
        with reader.cursor() as cursor:
            keys = " OR ".join(["(partition_key = %s AND message_offset = %s)"] * len(messages))
            cursor.execute(
                "SELECT partition_key, message_offset, invisible_until, retry_count FROM "
                f"queue_delivery_state WHERE consumer_group = %s AND topic = %s AND ({keys})",
                [group, messages[0].topic,
                 *itertools.chain.from_iterable((m.partition_key, m.offset) for m in messages)])
            rows = {(str(p), int(o)): (u, int(c)) for p, o, u, c in cursor.fetchall()}
    finally:
        reader.close()
    for message in messages:
        until, count = rows.get((message.partition_key, message.offset), (None, 0))
        if until:
            found[(message.partition_key, message.offset)] = (
                float(until) if count == message.attempt - 1 else 0.0)
    return found
