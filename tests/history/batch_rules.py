"""The history checker's rules for batch consumers (issue 55), per message of a batch.

A batch consumer's call is recorded as one ``Run`` per message, each with the batch's start,
end and name (``Run.batch``); every rule of ``tests.history.checker`` reads them as it reads
single runs (two runs of one batch overlap by design: I5's overlap rule lets them). What
only batches can break:

* **I5** an ordered group's batch holds consecutive messages of one partition in offset
  order: one partition; no message of it between the batch's first and last offset that
  had committed when the batch started, and was not done by then, is left out (unless it
  committed after a higher offset: found late, it starts after the run in flight).
* **I5** in an ordered batch, the messages after one that failed are given back
  (``uncharged``): none of them is acked or failed by that call; and none runs again before
  the failed one is done (handled well, or failed for the last time), since they wait
  behind it, unless in one call with the failed one's retry (after it there).
* **I7** a given-back message is not charged an attempt: its next run has the same attempt
  number (a fault that stopped the call before its outcomes were recorded excuses it, so
  does a call that outlived its visibility timeout: the batch is then delivered again,
  charged; and so does a fault before the next run, which may have ended a delivery of it
  that never reached the handler).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tests.history.model import Publish, Run

if TYPE_CHECKING:
    from tests.history.checker import Checker

#: outcomes that charge an attempt and stop an ordered batch there
FAILED = ("fail", "retry", "reject")
#: the clocks of one machine's processes disagree by this much (checker.CLOCK_SLACK_MS)
SLACK_MS = 50.0

Finding = tuple[str, str, list[Publish | Run]]


class BatchRules:
    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.history = checker.history
        self.batches: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for run in self.history.runs:
            if run.batch:
                self.batches[(run.group, run.batch)].append(run)
        for runs in self.batches.values():
            runs.sort(key=lambda r: (r.partition, r.offset))

    def _ordered(self) -> Iterator[tuple[str, str, list[Run]]]:
        for (group, name), runs in self.batches.items():
            if self.history.groups[group].ordered:
                yield group, name, runs

    # -- I5: the shape of an ordered batch --------------------------------------------------
    def consecutive(self) -> Iterator[Finding]:
        by_partition: dict[str, list[Publish]] = defaultdict(list)
        for publish in self.checker._first_publishes():
            by_partition[publish.partition].append(publish)
        # Committed after a higher offset of its partition: it may be read after that one
        # and start after the run in flight (I4's late commit), not in that batch.
        late = {partition: self.checker._found_late_ids(publishes)
                for partition, publishes in by_partition.items()}
        for group, name, runs in self._ordered():
            partitions = sorted({r.partition for r in runs})
            if len(partitions) > 1:
                yield ("I5", f"{group}'s ordered batch {name} mixes partitions "
                       f"{', '.join(partitions)}", list(runs))
                continue
            offsets = [r.offset for r in runs]
            if len(set(offsets)) != len(offsets):
                yield "I5", f"{group}'s batch {name} holds an offset twice", list(runs)
                continue
            start = runs[0].started_ms
            inside = set(offsets)
            for publish in by_partition[partitions[0]]:
                offset = publish.offset or 0
                if (offsets[0] < offset < offsets[-1] and offset not in inside
                        and publish.id not in late[partitions[0]]
                        and publish.ended_ms + SLACK_MS < start
                        and not self._done_by(group, publish, start)):
                    yield ("I5", f"{group}'s ordered batch {name} skips {publish.id} "
                           f"({publish.partition}@{offset}), committed and not done when it "
                           "started", [publish, *runs])

    # -- I5: what follows a failure in an ordered batch -------------------------------------
    def given_back_after_a_failure(self) -> Iterator[Finding]:
        for group, name, runs in self._ordered():
            if any(r.outcome == "cut" for r in runs):
                continue  # the call never returned: nothing was recorded for any of it
            failed = next((r for r in runs if r.outcome in FAILED), None)
            for run in runs:
                after = failed is not None and run.offset > failed.offset
                if after and run.outcome != "uncharged":
                    yield ("I5", f"{group}'s ordered batch {name}: {run.id} came after "
                           f"{failed.id}, which failed, but was {run.outcome}",  # type: ignore[union-attr]
                           [failed, run])  # type: ignore[list-item]
                elif not after and run.outcome == "uncharged":
                    yield ("I5", f"{group}'s batch {name} gave {run.id} back with no "
                           "failure before it", list(runs))
            if failed is not None:
                yield from self._wait_behind(group, failed, runs)

    def _wait_behind(self, group: str, failed: Run, runs: list[Run]) -> Iterator[Finding]:
        """The given-back messages run again only once ``failed`` is done."""
        done_at = self._done_after(group, failed)
        for run in runs:
            if run.outcome != "uncharged":
                continue
            later = self._next_run(run)
            if later is None or self._excused(failed) or self._excused(run):
                continue
            if later.batch and any(r.batch == later.batch for r in self.checker.runs_of[
                    (group, failed.partition, failed.id)]):
                continue  # behind the failed one's retry in one call: the order rule's
            if done_at is None or later.started_ms + SLACK_MS < done_at:
                yield ("I5", f"{group}: {run.id}, given back behind {failed.id}, ran again "
                       f"before {failed.id} was done", [failed, run, later])

    # -- I7: given back, not charged --------------------------------------------------------
    def given_back_uncharged(self) -> Iterator[Finding]:
        for run in self.history.runs:
            if run.outcome != "uncharged":
                continue
            later = self._next_run(run)
            if later is None or later.attempt == run.attempt or self._excused(run):
                continue
            if run.finished_ms is not None and self.checker._outlived(run, run.finished_ms):
                continue  # given back after its timeout ran out: delivered again, charged
            if self._lost_between(run, later):
                continue  # a delivery in between that never ran: charged, rightly
            yield ("I7", f"{run.group}: {run.id} was given back uncharged (attempt "
                   f"{run.attempt}) but ran next as attempt {later.attempt}", [run, later])

    # -- helpers ------------------------------------------------------------------------------
    def _next_run(self, run: Run) -> Run | None:
        runs = self.checker.runs_of[(run.group, run.partition, run.id)]
        later = [r for r in runs if r.started_ms > run.started_ms]
        return later[0] if later else None

    def _excused(self, run: Run) -> bool:
        """A fault (a kill, a pause, an outage, a failover) caught the run before its
        outcomes were recorded: its batch is delivered again as a whole, charged."""
        return self.checker._faulted(run) or self.checker._database_lost_writes()

    def _lost_between(self, run: Run, later: Run) -> bool:
        """A fault between ``run``'s end and ``later``'s start (a kill, a pause, an outage,
        a failover, a stall long enough to lose leases) may have ended a delivery of the
        message that never reached its handler: an attempt charged with no run of it."""
        end = run.finished_ms if run.finished_ms is not None else run.started_ms
        for fault in self.history.faults:
            if fault.kind == "stall" and not self.checker._long_enough_to_lose_leases(fault):
                continue
            if fault.began_ms <= later.started_ms and fault.ended_ms >= end - SLACK_MS:
                return True
        return False

    def _done_by(self, group: str, publish: Publish, at_ms: float) -> bool:
        """Had ``group`` handled ``publish`` well, or failed it for the last time, by
        ``at_ms``?"""
        dead = self.checker.dead.get((group, publish.id))
        if self._dead_unseen(group, publish.partition, publish.id):
            return True  # dead-lettered when delivered once too often: when is not known
        for run in self.checker.runs_of[(group, publish.partition, publish.id)]:
            if run.finished_ms is None or run.finished_ms > at_ms + SLACK_MS:
                continue
            if run.outcome == "ok" or (dead is not None and run.attempt >= dead.attempts
                                       and run.outcome in FAILED):
                return True
        return False

    def _done_after(self, group: str, failed: Run) -> float | None:
        """When the message of ``failed`` was done (None: never): by a later run, or by an
        earlier attempt's late ack (a run past its visibility timeout that returned well
        while the message was delivered again: its ack is the message's, as
        ``Checker._done`` counts it)."""
        dead = self.checker.dead.get((group, failed.id))
        if dead is not None and failed.attempt >= dead.attempts:
            return failed.finished_ms
        if self._dead_unseen(group, failed.partition, failed.id):
            return float("-inf")  # dead-lettered with no run of its last attempt
        done: list[float] = []
        for run in self.checker.runs_of[(group, failed.partition, failed.id)]:
            if run is failed or run.finished_ms is None:
                continue
            if run.outcome == "ok" or (run.started_ms > failed.started_ms and dead is not None
                                       and run.attempt >= dead.attempts):
                done.append(run.finished_ms)
        return min(done, default=None)

    def _dead_unseen(self, group: str, partition: str, message_id: str) -> bool:
        """Dead-lettered without a run of its last attempt (attempts that never completed:
        its runner died, or its timeout ran out, once too often; the dead letter is
        written when it is delivered again, unrecorded)."""
        dead = self.checker.dead.get((group, message_id))
        return dead is not None and all(
            r.attempt < dead.attempts for r in self.checker.runs_of[(group, partition,
                                                                     message_id)])
