"""Checks SPEC §7/§10's invariants on a recorded ``History``: plain Python, no database.

Every workload of the test tiers (and ``make soak``) records what happened and hands it
here, so that each run checks every invariant, not only the one its scenario was written
for. ``check(history)`` returns the violations, each with the events around it; ``report``
prints the first ones. The rules, and what excuses an event:

* **I1** a handler only ever runs messages whose publishing transaction committed.
* **I2** one offset per (partition, id): every publish of an id reports the same offset,
  and only one of them says it created the row.
* **I3/I4/I6** every committed message still stored on the surviving server is, for every
  group, handled successfully or dead-lettered (late commits included).
* **I5** ordered groups: two runs of one partition never overlap, unless the first had
  outlived its visibility timeout when the second started, its runner was killed before
  (the run ended there), or the database changed server (an outage, a failover: the new
  one voids what the old one granted). A pause or a lock stall excuses nothing: a holder
  frozen past its lease while its handler runs is the takeover case (issue 51), where the
  new holder waits for that run's visibility timeout; and a message committed before
  another's commit began, at a lower offset of the same partition, starts first.
* **I7** no run of a (group, message) after its dead letter's last attempt.
* **I9** a retry after a failure waits its backoff: min(max, min x 2^(n-1)).
* **I11** one clock, **I12** no partition left unowned: the lease rules
  (``tests.history.lease_rules``), on the lease events the history recorded.
* **I10** a redelivery starts only after the visibility timeout of the run before it; and a
  run that finished well is never run again unless a fault caught it before its outcome
  was recorded (a slow runner, a lock stall, is no excuse: SPEC §10).
* **I8** a committed message missing from the surviving server was collected only after
  every group was done with it.
* **I13** in an atomic group a message is acked exactly when its handler's own write
  committed.
* **I16** every ack on the surviving server is of a message (by id, at that offset) that
  the group handled or dead-lettered: never a stale delivery's ack on a reused offset.
* Batch consumers' runs (one per message of a call) are read by every rule above; what
  only batches can break (an ordered batch's shape, what follows a failure in it, the
  given-back messages left uncharged: I5, I7) is ``tests.history.batch_rules``'.

Messages the database itself lost (a failover to a replica that was behind) are not
checked for delivery; a message at an offset the new server reused is checked by id.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tests.history.batch_rules import BatchRules
from tests.history.lease_rules import LeaseRules, describe
from tests.history.model import Fault, History, LeaseEvent, Publish, Run

#: the clocks of one machine's processes, and the database's, disagree by this much
CLOCK_SLACK_MS = 50.0
#: after a handler returns, its outcome is recorded within this long (a pass), unless a
#: fault stops the runner first
RECORD_WINDOW_MS = 5_000.0

Event = Publish | Run | Fault | LeaseEvent


@dataclass
class Violation:
    invariant: str
    text: str
    events: list[Event] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.invariant}: {self.text}"]
        lines += [f"    {_describe(event)}" for event in self.events]
        return "\n".join(lines)


def _describe(event: Event) -> str:
    if isinstance(event, Publish):
        state = "committed" if event.committed else "rolled back"
        return (f"publish {event.id} {event.partition}@{event.offset} by {event.publisher}: "
                f"begun {event.begun_ms:.0f}, commit begun {event.commit_begun_ms:.0f}, "
                f"{state} {event.ended_ms:.0f}{'' if event.created else ' (existed)'}")
    if isinstance(event, Run):
        ended = "never" if event.finished_ms is None else f"{event.finished_ms:.0f}"
        return (f"run {event.group} {event.id} {event.partition}@{event.offset} "
                f"attempt {event.attempt} on {event.runner}: {event.started_ms:.0f}-{ended} "
                f"{event.outcome}"
                + (f", visible again {event.visible_until_ms:.0f}"
                   if event.visible_until_ms else ""))
    if isinstance(event, LeaseEvent):
        return describe(event)
    return (f"{event.kind} {event.runner or 'everything'}: "
            f"{event.began_ms:.0f}-{event.ended_ms:.0f}")


class Checker:
    def __init__(self, history: History) -> None:
        self.history = history
        self.committed = [p for p in history.publishes if p.committed]
        self.committed_ids = {(p.partition, p.id) for p in self.committed}
        self.runs_of: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
        for run in sorted(history.runs, key=lambda r: (r.started_ms, r.attempt)):
            self.runs_of[(run.group, run.partition, run.id)].append(run)
        self.dead = {(d.group, d.id): d for d in history.final.dead_letters}
        self.stored_ids = set(history.final.stored.items())

    # -- the rules -------------------------------------------------------------------------
    def check(self) -> list[Violation]:
        rules: list[Callable[[], Iterator[Violation]]] = [
            self.only_committed_delivered, self.one_offset_per_id,
            self.every_message_done, self.ordered_runs_never_overlap,
            self.ordered_runs_follow_commits, self.nothing_after_a_dead_letter,
            self.backoff_respected, self.no_early_redelivery,
            self.no_redelivery_after_success, self.collected_only_when_done,
            self.acks_match_runs, self.atomic_writes_match_acks,
            self.leases_follow_one_clock, self.partitions_never_left_unowned,
            self.batches_keep_their_rules,
        ]
        return [violation for rule in rules for violation in rule()]

    def only_committed_delivered(self) -> Iterator[Violation]:
        for run in self.history.runs:
            if (run.partition, run.id) not in self.committed_ids:
                yield Violation("I1", f"{run.id} ran for {run.group} but was never committed",
                                self._around(run))

    def one_offset_per_id(self) -> Iterator[Violation]:
        by_id: dict[tuple[str, str], list[Publish]] = defaultdict(list)
        for publish in self.committed:
            by_id[(publish.partition, publish.id)].append(publish)
        for (_, message_id), publishes in by_id.items():
            offsets = {p.offset for p in publishes}
            created = [p for p in publishes if p.created]
            if len(offsets) > 1 or len(created) != 1:
                yield Violation("I2", f"{message_id}: offsets {sorted(map(str, offsets))}, "
                                f"{len(created)} publish(es) said created", publishes)

    def every_message_done(self) -> Iterator[Violation]:
        for publish in self._first_publishes():
            if self.history.final.stored.get((publish.partition, publish.offset)) != publish.id:
                # Lost by the database (a failover: its offset may name another message
                # there now), or collected (collected_only_when_done).
                continue
            for group in self.history.groups:
                if not self._done(group, publish):
                    yield Violation(
                        "I3", f"{publish.id} ({publish.partition}@{publish.offset}) was never "
                        f"handled nor dead-lettered by {group}", [publish, *self.runs_of[
                            (group, publish.partition, publish.id)]])

    def ordered_runs_never_overlap(self) -> Iterator[Violation]:
        for group, partition, runs in self._ordered_partitions():
            for before, after in self._overlapping(runs):
                if before.batch and before.batch == after.batch:
                    continue  # one call's messages: they run together by design
                if self._outlived(before, after.started_ms) or self._ended_before(
                        before, after.started_ms):
                    continue
                yield Violation("I5", f"{group} ran {after.id} in {partition} while "
                                f"{before.id} was still running", [before, after])

    def batches_keep_their_rules(self) -> Iterator[Violation]:
        rules = BatchRules(self)
        for found in (rules.consecutive(), rules.given_back_after_a_failure(),
                      rules.given_back_uncharged()):
            for invariant, text, events in found:
                yield Violation(invariant, text, list(events))

    def leases_follow_one_clock(self) -> Iterator[Violation]:
        for text, events in LeaseRules(self.history).one_clock():
            yield Violation("I11", text, list(events))

    def partitions_never_left_unowned(self) -> Iterator[Violation]:
        for text, events in LeaseRules(self.history).never_left_unowned():
            yield Violation("I12", text, list(events))

    def ordered_runs_follow_commits(self) -> Iterator[Violation]:
        firsts = self._first_publishes()
        for group, config in self.history.groups.items():
            if not config.ordered:
                continue
            by_partition: dict[str, list[Publish]] = defaultdict(list)
            for publish in firsts:
                by_partition[publish.partition].append(publish)
            for publishes in by_partition.values():
                yield from self._commit_order(group, publishes)

    def _commit_order(self, group: str, publishes: list[Publish]) -> Iterator[Violation]:
        """A message committed before another's commit began, at a lower offset, starts
        first; unless it was found late itself (a higher offset of its partition could be
        read before it committed: SPEC §10 lets it start after the run in flight).

        One pass over the publishes by the time their commit began: those whose commit
        had ended by then (with slack) go into a tree of the latest first start by offset
        (a Fenwick tree of maxima), which says at once whether a lower offset committed
        earlier started after this one. O(n log n) a partition: a soak's holds thousands."""
        started = {p.id: self._first_start(group, p) for p in publishes}
        late = self._found_late_ids(publishes)
        rank = {p.id: n for n, p in enumerate(sorted(publishes, key=lambda p: p.offset or 0),
                                              start=1)}
        latest = _LatestStartBelow(len(publishes))
        by_end = sorted((p for p in publishes if started[p.id] is not None
                         and p.id not in late), key=lambda p: p.ended_ms)
        waiting = 0
        for later in sorted(publishes, key=lambda p: p.commit_begun_ms):
            while (waiting < len(by_end)
                   and by_end[waiting].ended_ms + CLOCK_SLACK_MS < later.commit_begun_ms):
                earlier = by_end[waiting]
                latest.add(rank[earlier.id], started[earlier.id] or 0.0, earlier)
                waiting += 1
            first_later = started[later.id]
            if first_later is None:
                continue
            start, earlier_or_none = latest.below(rank[later.id])
            if earlier_or_none is not None and first_later + CLOCK_SLACK_MS < start:
                earlier = earlier_or_none
                yield Violation(
                    "I5", f"{group} started {later.id} before {earlier.id}, committed "
                    "earlier at a lower offset", [earlier, later, *self.runs_of[
                        (group, earlier.partition, earlier.id)][:1], *self.runs_of[
                        (group, later.partition, later.id)][:1]])

    @staticmethod
    def _found_late_ids(partition: list[Publish]) -> set[str]:
        """Ids of messages a higher offset of their partition may have been read before:
        one committed before them (with slack). By offset, highest first, keeping the
        earliest commit seen above."""
        late: set[str] = set()
        earliest_above = float("inf")
        for publish in sorted(partition, key=lambda p: -(p.offset or 0)):
            if earliest_above < publish.ended_ms + CLOCK_SLACK_MS:
                late.add(publish.id)
            earliest_above = min(earliest_above, publish.ended_ms)
        return late

    def nothing_after_a_dead_letter(self) -> Iterator[Violation]:
        for (group, message_id), dead in self.dead.items():
            for (run_group, _, run_id), runs in self.runs_of.items():
                if run_group == group and run_id == message_id:
                    for run in runs:
                        if run.attempt > dead.attempts:
                            yield Violation("I7", f"{message_id} ran again for {group} after "
                                            f"its dead letter ({dead.attempts} attempts)",
                                            [run])

    def backoff_respected(self) -> Iterator[Violation]:
        for (group, _, _), runs in self.runs_of.items():
            config = self.history.groups[group]
            for before, after in itertools.pairwise(runs):
                if (before.outcome != "fail" or before.finished_ms is None
                        or after.attempt != before.attempt + 1 or self._faulted(before)):
                    continue
                if after.started_ms < before.finished_ms and self._outlived(
                        before, after.started_ms):
                    continue  # delivered again after the timeout, before the failure: I10's
                delivered = self._delivered_at(after, config.visibility_ms)
                if (delivered is not None and delivered < before.finished_ms
                        and self._outlived(before, delivered)):
                    # Delivered again once the timeout ran out, before the failure, and
                    # started only when that run ended (an ordered partition's new run
                    # waits for the one still running): I10's too, not a retry.
                    continue
                backoff = min(config.max_backoff_ms,
                              config.min_backoff_ms * 2 ** (before.attempt - 1))
                if after.started_ms + CLOCK_SLACK_MS < before.finished_ms + backoff:
                    yield Violation("I9", f"retry of {after.id} for {group} after "
                                    f"{after.started_ms - before.finished_ms:.0f} ms, "
                                    f"backoff {backoff} ms", [before, after])

    def no_early_redelivery(self) -> Iterator[Violation]:
        for (group, _, _), runs in self.runs_of.items():
            for before, after in itertools.pairwise(runs):
                retried = before.outcome in ("fail", "retry", "reject", "uncharged") and (
                    before.finished_ms is None
                    or after.started_ms + CLOCK_SLACK_MS >= before.finished_ms)
                if retried:
                    continue  # a retry: backoff_respected's, once the outcome was recorded
                if self._outlived(before, after.started_ms) or self._faulted(before):
                    continue
                yield Violation("I10", f"{after.id} delivered again to {group} before the "
                                "visibility timeout of the run before it", [before, after])

    def no_redelivery_after_success(self) -> Iterator[Violation]:
        for (group, _, _), runs in self.runs_of.items():
            for before, after in itertools.pairwise(runs):
                if before.outcome != "ok" or self._faulted(before):
                    continue
                if before.finished_ms is not None and self._outlived(
                        before, before.finished_ms):
                    continue  # it finished past its timeout: a redelivery was allowed
                yield Violation("I10", f"{after.id} ran again for {group} although its run "
                                "before had finished well within its timeout",
                                [before, after])

    def collected_only_when_done(self) -> Iterator[Violation]:
        if self._database_lost_writes():
            return  # a failover: what is missing was lost, not collected
        for publish in self._first_publishes():
            if (publish.partition, publish.offset) in self.history.final.stored:
                continue
            undone = [g for g in self.history.groups if not self._done(g, publish)]
            if undone or not self.history.final.collectable:
                yield Violation("I8", f"{publish.id} ({publish.partition}@{publish.offset}) is "
                                f"gone, and not done by {undone or 'garbage collection'}",
                                [publish])

    def acks_match_runs(self) -> Iterator[Violation]:
        stored = self.history.final.stored
        for group, partition, offset in sorted(self.history.final.acked):
            message_id = stored.get((partition, offset))
            if message_id is None:
                continue
            ok = any(run.outcome == "ok" for run in self.runs_of[(group, partition,
                                                                  message_id)])
            if not ok and (group, message_id) not in self.dead:
                yield Violation("I16", f"{group} acked {partition}@{offset} ({message_id}) "
                                "without a run of it that succeeded", self.runs_of[
                                    (group, partition, message_id)][-3:])

    def atomic_writes_match_acks(self) -> Iterator[Violation]:
        """I13: in an atomic group, a message is acked exactly when its handler's own
        write committed (they are one transaction)."""
        writes = self.history.final.atomic_writes
        if writes is None:
            return
        stored = self.history.final.stored
        for group, written in writes.items():
            acked = {stored[(p, o)] for g, p, o in self.history.final.acked
                     if g == group and (p, o) in stored}
            dead = {i for g, i in self.dead if g == group}
            kept = set(stored.values())  # a collected message says nothing either way
            for message_id in sorted((acked - dead) ^ (written & kept)):
                state = "acked without" if message_id in acked else "not acked, with"
                yield Violation("I13", f"{group}: {message_id} {state} its handler's write",
                                self.runs_of_id(group, message_id))

    def runs_of_id(self, group: str, message_id: str) -> list[Run]:
        return [r for (g, _, i), runs in self.runs_of.items() if g == group and i == message_id
                for r in runs]

    # -- helpers ---------------------------------------------------------------------------
    def _first_publishes(self) -> list[Publish]:
        """The publish that created each committed message."""
        return [p for p in self.committed if p.created and p.offset is not None]

    def _done(self, group: str, publish: Publish) -> bool:
        runs = self.runs_of[(group, publish.partition, publish.id)]
        return any(r.outcome == "ok" for r in runs) or (group, publish.id) in self.dead

    def _first_start(self, group: str, publish: Publish) -> float | None:
        runs = self.runs_of[(group, publish.partition, publish.id)]
        return runs[0].started_ms if runs else None

    def _ordered_partitions(self) -> Iterator[tuple[str, str, list[Run]]]:
        by_partition: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for run in self.history.runs:
            if self.history.groups[run.group].ordered:
                by_partition[(run.group, run.partition)].append(run)
        for (group, partition), runs in by_partition.items():
            yield group, partition, sorted(runs, key=lambda r: r.started_ms)

    @staticmethod
    def _overlapping(runs: list[Run]) -> Iterator[tuple[Run, Run]]:
        """Pairs of runs where the second started before the first ended."""
        for index, before in enumerate(runs):
            end = before.finished_ms if before.finished_ms is not None else float("inf")
            for after in runs[index + 1:]:
                if after.started_ms >= end - CLOCK_SLACK_MS:
                    break
                yield before, after

    @staticmethod
    def _delivered_at(run: Run, visibility_ms: int) -> float | None:
        """When ``run``'s delivery was marked: its visibility deadline as read at its
        start, less the timeout. A deadline stamped again while it waited in the queue
        is later (the estimate errs late); it errs early only where the run before's
        failure was written after this mark (its backoff's deadline), and then this
        delivery was made before that failure was known: no retry of it either. None:
        not known."""
        if not run.visible_until_ms:
            return None
        return run.visible_until_ms - visibility_ms

    @staticmethod
    def _outlived(run: Run, at_ms: float) -> bool:
        """Had ``run``'s visibility timeout run out by ``at_ms``?"""
        return run.visible_until_ms is not None and at_ms + CLOCK_SLACK_MS >= \
            run.visible_until_ms

    def _faulted(self, run: Run) -> bool:
        """Did a fault catch ``run`` before its outcome could be recorded (a kill or
        pause of its runner, an outage, a failover)? A lock stall is not one, unless it
        lasted long enough for leases to expire under it (``lease_at_risk_ms``)."""
        if run.outcome == "cut":
            return True
        end = (run.finished_ms if run.finished_ms is not None else float("inf")) \
            + RECORD_WINDOW_MS
        for fault in self.history.faults:
            if fault.runner is not None and fault.runner != run.runner:
                continue
            if fault.kind == "stall" and not self._long_enough_to_lose_leases(fault):
                continue
            if fault.began_ms <= end and fault.ended_ms >= run.started_ms - CLOCK_SLACK_MS:
                return True
        return False

    def _ended_before(self, run: Run, at_ms: float) -> bool:
        """Had ``run`` ended by ``at_ms`` although it never said so: its runner killed
        while it ran, or the database moved to another server (which voids the old one's
        deliveries: a new holder may start at once)?"""
        for fault in self.history.faults:
            if fault.kind == "kill" and fault.runner == run.runner:
                if run.started_ms - CLOCK_SLACK_MS <= fault.began_ms <= at_ms + CLOCK_SLACK_MS:
                    return True
            elif fault.kind in ("outage", "failover") and fault.runner is None:
                end = run.finished_ms if run.finished_ms is not None else float("inf")
                if fault.began_ms <= end and fault.ended_ms >= run.started_ms - CLOCK_SLACK_MS:
                    return True
        return False

    def _long_enough_to_lose_leases(self, stall: Fault) -> bool:
        risk = self.history.lease_at_risk_ms
        return risk is not None and stall.ended_ms - stall.began_ms >= risk

    def _database_lost_writes(self) -> bool:
        return any(f.kind == "failover" for f in self.history.faults)

    def _around(self, event: Run | Publish, count: int = 6) -> list[Event]:
        """The events of ``event``'s partition closest to it in time."""
        at = event.started_ms if isinstance(event, Run) else event.begun_ms
        near: list[tuple[float, Event]] = []
        for publish in self.history.publishes:
            if publish.partition == event.partition:
                near.append((abs(publish.begun_ms - at), publish))
        for run in self.history.runs:
            if run.partition == event.partition:
                near.append((abs(run.started_ms - at), run))
        return [e for _, e in sorted(near, key=lambda item: item[0])[:count]]


class _LatestStartBelow:
    """Prefix maxima over ranks 1..n (a Fenwick tree): the latest start, and its publish,
    among those added with a rank below a given one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tree: list[tuple[float, Publish | None]] = [(float("-inf"), None)] * (size + 1)

    def add(self, rank: int, start: float, publish: Publish) -> None:
        while rank <= self.size:
            if start > self.tree[rank][0]:
                self.tree[rank] = (start, publish)
            rank += rank & -rank

    def below(self, rank: int) -> tuple[float, Publish | None]:
        best: tuple[float, Publish | None] = (float("-inf"), None)
        rank -= 1
        while rank > 0:
            if self.tree[rank][0] > best[0]:
                best = self.tree[rank]
            rank -= rank & -rank
        return best


def check(history: History) -> list[Violation]:
    return Checker(history).check()


def report(history: History, violations: Iterable[Violation], limit: int = 3) -> str:
    """A summary line, and the first ``limit`` violations with their events."""
    found = list(violations)
    lines = [f"history of seed {history.seed}: {history.events} events "
             f"({len(history.publishes)} publishes, {len(history.runs)} runs, "
             f"{len(history.faults)} faults) checked; {len(found)} violation(s)"]
    lines += [str(v) for v in found[:limit]]
    return "\n".join(lines)
