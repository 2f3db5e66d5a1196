"""The history checker (tests/history) on hand-made histories: a clean one passes, and
each invariant's violation, the wave-3 defects among them, is reported by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.history.checker import check, report
from tests.history.model import (
    DeadLetter,
    Fault,
    FinalState,
    GroupConfig,
    History,
    Publish,
    Run,
)

VT = 1_000


def publish(message_id: str, offset: int, at: float, *, partition: str = "k",
            committed: bool = True, created: bool = True, commit_after: float = 10
            ) -> Publish:
    return Publish("p1", "t", partition, message_id, offset, at, at + commit_after,
                   at + commit_after + 5, committed, created)


def run(message_id: str, offset: int, start: float, end: float | None, *, group: str = "g",
        attempt: int = 1, outcome: str = "ok", runner: str = "r1", partition: str = "k",
        ) -> Run:
    return Run(group, "t", partition, offset, message_id, attempt, runner, start, end,
               outcome, visible_until_ms=start + VT)  # type: ignore[arg-type]


def history(publishes: list[Publish], runs: list[Run], *, ordered: bool = True,
            faults: list[Fault] | None = None, dead: list[DeadLetter] | None = None,
            acked: set[tuple[str, str, int]] | None = None) -> History:
    stored = {(p.partition, p.offset): p.id for p in publishes
              if p.committed and p.created and p.offset is not None}
    if acked is None:
        acked = {("g", r.partition, r.offset) for r in runs if r.outcome == "ok"}
    return History("t", {"g": GroupConfig(ordered=ordered, max_attempts=3, min_backoff_ms=100,
                                           max_backoff_ms=400, visibility_ms=VT)},
                   publishes, runs, faults or [],
                   FinalState(acked=acked, stored=stored, dead_letters=dead or []), seed=7)


def invariants(h: History) -> list[str]:
    return [v.invariant for v in check(h)]


CLEAN = history(
    [publish("a", 1, 0), publish("b", 2, 20), publish("c", 3, 40, committed=False)],
    [run("a", 1, 100, 150), run("b", 2, 160, 200)],
)


def test_a_clean_history_passes() -> None:
    assert check(CLEAN) == []
    assert "0 violation(s)" in report(CLEAN, [])


def test_a_rolled_back_message_that_ran_breaks_i1() -> None:
    h = replace(CLEAN, runs=[*CLEAN.runs, run("c", 3, 300, 310)])
    assert "I1" in invariants(h)


def test_two_offsets_for_one_id_break_i2() -> None:
    h = history([publish("a", 1, 0), publish("a", 2, 30)],
                [run("a", 1, 100, 150), run("a", 2, 160, 200)])
    assert "I2" in invariants(h)


def test_an_idempotent_second_publish_is_fine() -> None:
    h = history([publish("a", 1, 0), publish("a", 1, 30, created=False)],
                [run("a", 1, 100, 150)])
    assert check(h) == []


def test_a_message_nobody_handled_breaks_i3() -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 20)], [run("a", 1, 100, 150)])
    found = check(h)
    assert [v.invariant for v in found] == ["I3"]
    assert "b (k@2)" in found[0].text


def test_a_dead_letter_counts_as_done() -> None:
    runs = [run("a", 1, 100, 110, outcome="fail", attempt=n) for n in (1,)]
    runs += [run("a", 1, 300, 310, outcome="fail", attempt=2),
             run("a", 1, 800, 810, outcome="fail", attempt=3)]
    h = history([publish("a", 1, 0)], runs, dead=[DeadLetter("g", "a", 3, "boom")],
                acked={("g", "k", 1)})
    assert check(h) == []


def test_a_late_commit_running_beside_the_ordered_run_breaks_i5() -> None:
    """The wave-3 control run: @28 committed late, ran while @57 ran."""
    h = history([publish("late", 28, 0, commit_after=500), publish("b", 57, 100)],
                [run("b", 57, 200, 1_700), run("late", 28, 203, 1_703)])
    assert "I5" in invariants(h)


def test_an_ordered_redelivery_past_the_timeout_may_overlap() -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 10)],
                [run("a", 1, 100, 3_000), run("a", 1, 1_200, 1_300, attempt=2),
                 run("b", 2, 1_400, 1_500)])
    assert "I5" not in invariants(h)


def test_starting_a_later_commit_first_breaks_i5() -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 100)],
                [run("b", 2, 200, 210), run("a", 1, 400, 410)])
    assert "I5" in invariants(h)


def test_a_late_commit_may_start_after_higher_offsets() -> None:
    h = history([publish("late", 1, 0, commit_after=300), publish("b", 2, 50)],
                [run("b", 2, 100, 150), run("late", 1, 400, 450)])
    assert check(h) == []


def test_a_run_after_the_dead_letter_breaks_i7() -> None:
    runs = [run("a", 1, 100, 110, outcome="fail"),
            run("a", 1, 300, 310, outcome="fail", attempt=2),
            run("a", 1, 800, 810, outcome="fail", attempt=3),
            run("a", 1, 2_000, 2_010, attempt=4)]
    h = history([publish("a", 1, 0)], runs, dead=[DeadLetter("g", "a", 3, "boom")])
    assert "I7" in invariants(h)


def test_a_retry_before_its_backoff_breaks_i9() -> None:
    runs = [run("a", 1, 100, 110, outcome="fail"), run("a", 1, 150, 160, attempt=2)]
    assert "I9" in invariants(history([publish("a", 1, 0)], runs))


def test_a_redelivery_after_the_timeout_of_a_run_that_then_fails_is_no_early_retry() -> None:
    """Attempt 1 started with little of its timeout left, outlived it, and failed while
    attempt 2 (delivered again after the timeout) already ran: attempt 2 is no retry of
    that failure, so its backoff does not apply (seed 1134005021 on PostgreSQL)."""
    first = replace(run("a", 1, 100, 170, outcome="fail"), visible_until_ms=110)
    again = run("a", 1, 140, 160, attempt=2)
    assert not invariants(history([publish("a", 1, 0)], [first, again]))
    early = replace(first, visible_until_ms=1_100)  # within its timeout: an early retry
    assert "I9" in invariants(history([publish("a", 1, 0)], [early, again]))


def test_a_redelivery_made_before_a_late_failure_may_start_after_it() -> None:
    """Attempt 1 outlives its timeout (at 1,100) and fails at 1,400; attempt 2 was
    delivered again at 1,150 (its deadline 2,150 = 1,150 + the 1,000 ms timeout) and
    started at 1,410, once attempt 1 ended (an ordered partition's new run waits for the
    one still running): no retry of that failure, its backoff does not apply (seed
    1291695760 on SQLite, wave 4's seventh session)."""
    first = run("a", 1, 100, 1_400, outcome="fail")
    again = replace(run("a", 1, 1_410, 1_420, attempt=2), visible_until_ms=2_150)
    assert not invariants(history([publish("a", 1, 0)], [first, again]))
    # Marked after the failure (its deadline 2,405): a retry, 10 ms after it.
    retried = replace(again, visible_until_ms=2_405)
    assert "I9" in invariants(history([publish("a", 1, 0)], [first, retried]))


def test_a_redelivery_before_the_timeout_breaks_i10() -> None:
    runs = [run("a", 1, 100, None, outcome="cut", runner="r1"),
            run("a", 1, 600, 650, attempt=2, runner="r2")]
    h = history([publish("a", 1, 0)], runs)
    assert "I10" not in invariants(h)  # the first was cut by a kill: excused
    runs[0] = replace(runs[0], outcome="ok", finished_ms=3_000, visible_until_ms=1_100)
    assert "I10" in invariants(history([publish("a", 1, 0)], runs))


def test_a_finished_run_redelivered_after_a_lock_stall_breaks_i10() -> None:
    """The wave-3 run with 4.5 s row locks: finished during the stall, run again."""
    runs = [run("a", 1, 100, 400), run("a", 1, 1_150, 1_200, attempt=2)]
    stall = Fault("stall", 0, 4_500)
    found = invariants(history([publish("a", 1, 0)], runs, faults=[stall]))
    assert "I10" in found
    kill = Fault("kill", 450, 460, runner="r1")
    assert "I10" not in invariants(history([publish("a", 1, 0)], runs, faults=[kill]))


def test_a_message_collected_before_every_group_was_done_breaks_i8() -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 10)], [run("a", 1, 100, 150)])
    h.final.stored.pop(("k", 2))
    h.final.collectable = True
    assert "I8" in invariants(h)


def test_an_ack_of_a_message_that_never_ran_breaks_i16() -> None:
    """A7: a stale delivery's ack on the promoted server marks the new message that
    reuses its offset."""
    h = history([publish("b-1", 7, 0), publish("c-1", 7, 5_000)],
                [run("b-1", 7, 100, 3_600)],
                faults=[Fault("failover", 1_000, 3_000)])
    h.final.stored = {("k", 7): "c-1"}
    h.final.acked = {("g", "k", 7)}
    assert "I16" in invariants(h)


def test_a_history_goes_to_a_file_and_back(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    h = history([publish("a", 1, 0)], [run("a", 1, 100, 150)],
                faults=[Fault("kill", 1, 2, "r1")], dead=[DeadLetter("g", "x", 3, "e")])
    h.dump(path)
    again = History.load(path)
    assert (again.publishes, again.runs, again.faults, again.final.acked,
            again.final.stored, again.seed) == (h.publishes, h.runs, h.faults, h.final.acked,
                                                h.final.stored, 7)


@pytest.mark.parametrize("limit", [1, 3])
def test_the_report_prints_the_first_violations_with_their_events(limit: int) -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 20), publish("c", 3, 30)], [])
    text = report(h, check(h), limit=limit)
    assert "3 violation(s)" in text
    assert text.count("I3:") == limit
    assert "publish b k@2" in text or limit == 1


def test_a_stall_long_enough_to_cost_leases_excuses_a_redelivery() -> None:
    runs = [run("a", 1, 100, 400), run("a", 1, 4_600, 4_700, attempt=2, runner="r2")]
    h = history([publish("a", 1, 0)], runs, faults=[Fault("stall", 300, 4_400)])
    assert "I10" in invariants(h)  # by default a stall never excuses
    h.lease_at_risk_ms = 3_000
    assert "I10" not in invariants(h)
    h.faults = [Fault("stall", 300, 1_300)]  # too short to lose a lease
    assert "I10" in invariants(h)


def test_an_atomic_ack_without_its_handlers_write_breaks_i13() -> None:
    h = history([publish("a", 1, 0), publish("b", 2, 10)],
                [run("a", 1, 100, 150), run("b", 2, 160, 200)])
    h.final.atomic_writes = {"g": {"a", "b"}}
    assert check(h) == []
    h.final.atomic_writes = {"g": {"a"}}
    found = check(h)
    assert [v.invariant for v in found] == ["I13"] and "b acked without" in found[0].text
    h.final.acked.discard(("g", "k", 2))
    h.final.atomic_writes = {"g": {"a", "b"}}
    assert "I13" in invariants(h)  # a write whose message is not acked
