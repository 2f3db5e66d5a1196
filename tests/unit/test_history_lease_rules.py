"""The history checker's lease rules (I11, I12) and I5 across a takeover, on hand-made
histories: a clean one passes, and each violation is reported by name (issue 51)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.history.checker import check
from tests.history.lease_log import LeaseLines, lease_event, read_lines
from tests.history.model import Fault, History, LeaseEvent
from tests.unit.test_history_checker import VT, history, publish, run

LEASE, RENEW = 4_000, 1_000


def lease(change: str, at: float, *, holder: str = "a", tenure: int = 1,
          partition: str = "k", generation: int = 1) -> LeaseEvent:
    return LeaseEvent("g", partition, holder, holder, change,  # type: ignore[arg-type]
                      generation, tenure, at)


def with_leases(base: History, events: list[LeaseEvent],
                faults: list[Fault] | None = None) -> History:
    h = replace(base, leases=[], lease_ms=LEASE, renew_ms=RENEW,
                faults=[*base.faults, *(faults or [])])
    for event in events:
        h.leased(event)
    return h


BASE = history([publish("a", 1, 0), publish("b", 2, 20), publish("c", 3, 6_000)],
               [run("a", 1, 100, 150), run("b", 2, 160, 200),
                run("c", 3, 9_200, 9_250, runner="b")])
#: a holds k from 0, renews every second up to 5,000, and dies; b takes it once the
#: lease ran out (9,000) and holds it to the end, running c (committed at 6,015); another
#: partition j is b's
HANDED_OVER = [
    lease("acquired", 0), *(lease("renewed", t) for t in range(1_000, 6_000, 1_000)),
    lease("acquired", 9_100, holder="b", tenure=7, generation=2),
    *(lease("renewed", t, holder="b", tenure=7, generation=2) for t in (10_100, 11_100)),
    lease("acquired", 0, partition="j", holder="b", tenure=3),
    lease("renewed", 11_000, partition="j", holder="b", tenure=3),
]


def invariants(h: History) -> list[str]:
    return [v.invariant for v in check(h)]


def test_a_clean_takeover_passes() -> None:
    h = with_leases(BASE, HANDED_OVER)
    assert check(h) == []
    # Renewals fold into the tenure's latest: a long run's history stays small.
    renewals = [e for e in h.leases if e.change == "renewed" and e.holder == "a"]
    assert [(e.at_ms, e.renewals) for e in renewals] == [(5_000, 5)]


def test_a_takeover_before_the_lease_ran_out_breaks_i11() -> None:
    early = [*HANDED_OVER[:6], lease("acquired", 7_000, holder="b", tenure=7, generation=2),
             *HANDED_OVER[7:]]
    found = check(with_leases(BASE, early))
    assert [v.invariant for v in found] == ["I11"]
    assert "valid until 9000" in found[0].text


def test_two_holders_renewing_at_once_break_i11() -> None:
    both = [*HANDED_OVER, lease("renewed", 9_500, holder="a")]
    assert "I11" in invariants(with_leases(BASE, both))


def test_a_renewal_recorded_late_by_a_pause_of_its_holder_is_not_an_overlap() -> None:
    """A renewal read at 5,000 and logged after the holder's process was stopped for
    3,500 ms is recorded at 8,500: by itself a lease valid until 12,500, which b's
    takeover at 9,100 would break. The pause (ended within a lease after the recorded
    time) is what made it late; without a pause it is an overlap."""
    late = [*HANDED_OVER[:5], lease("renewed", 8_500), *HANDED_OVER[6:]]
    assert invariants(with_leases(BASE, late)) == ["I11"]
    pause = Fault("pause", 5_000, 8_500, runner="a")
    assert "I11" not in invariants(with_leases(BASE, late, [pause]))
    # A pause of another runner excuses nothing.
    other = Fault("pause", 5_000, 8_500, runner="b")
    assert "I11" in invariants(with_leases(BASE, late, [other]))


def test_a_takeover_right_after_a_release_is_fine() -> None:
    released = [*HANDED_OVER[:6], lease("released", 5_100),
                lease("acquired", 5_300, holder="b", tenure=7, generation=1),
                *HANDED_OVER[8:]]
    assert check(with_leases(BASE, released)) == []


def test_a_failover_excuses_an_early_takeover() -> None:
    early = [*HANDED_OVER[:6], lease("acquired", 6_000, holder="b", tenure=7, generation=9),
             *HANDED_OVER[7:]]
    failover = [Fault("failover", 5_500, 5_900)]
    assert "I11" not in invariants(with_leases(BASE, early, failover))


#: c waits from 6,015 until b takes k at 15,000
LATE_RUN = replace(BASE, runs=[*BASE.runs[:2], run("c", 3, 15_100, 15_150, runner="b")])


def test_a_partition_left_unowned_for_long_breaks_i12() -> None:
    late = [*HANDED_OVER[:6], lease("acquired", 15_000, holder="b", tenure=7, generation=2),
            lease("renewed", 16_000, holder="b", tenure=7, generation=2), *HANDED_OVER[9:]]
    found = check(with_leases(LATE_RUN, late))
    assert [v.invariant for v in found] == ["I12"]
    assert "taken only at 15000" in found[0].text


def test_a_partition_with_nothing_to_deliver_may_stay_free() -> None:
    late = [*HANDED_OVER[:6], lease("acquired", 15_000, holder="b", tenure=7, generation=2),
            *HANDED_OVER[9:]]
    idle = history(BASE.publishes[:2], BASE.runs[:2])
    assert check(with_leases(idle, late)) == []


def test_nobody_left_to_take_it_excuses_i12() -> None:
    # b's tenure of j ends when a's does: nobody held anything until b came back.
    alone = [*HANDED_OVER[:6], lease("acquired", 0, partition="j", holder="b", tenure=3),
             lease("renewed", 5_000, partition="j", holder="b", tenure=3),
             lease("acquired", 15_000, holder="b", tenure=7, generation=2)]
    assert "I12" not in invariants(with_leases(LATE_RUN, alone))


def test_a_pause_of_the_others_excuses_i12_but_one_of_the_holder_does_not() -> None:
    late = [*HANDED_OVER[:6], lease("acquired", 15_000, holder="b", tenure=7, generation=2),
            *HANDED_OVER[9:]]
    others = [Fault("pause", 8_000, 12_000, runner="b")]
    holders = [Fault("pause", 5_500, 14_000, runner="a")]
    assert "I12" not in invariants(with_leases(LATE_RUN, late, others))
    assert "I12" in invariants(with_leases(LATE_RUN, late, holders))


def test_a_run_beside_a_frozen_holders_run_breaks_i5() -> None:
    """Issue 51: a holds the ordered partition, runs b (@2) and is frozen past its lease;
    the new holder starts the late-found @1 while b's run is in flight and inside its
    visibility timeout. The pause excuses nothing (before issue 51 it did)."""
    frozen = history([publish("late", 1, 0, commit_after=900), publish("b", 2, 10)],
                     [run("b", 2, 100, 800, runner="a"),
                      run("late", 1, 600, 650, runner="b")],
                     faults=[Fault("pause", 200, 700, runner="a")])
    assert "I5" in invariants(frozen)
    waited = replace(frozen, runs=[frozen.runs[0], replace(frozen.runs[1],
                                                           started_ms=100 + VT + 10,
                                                           finished_ms=100 + VT + 50)])
    assert "I5" not in invariants(waited)


def test_a_kill_ends_the_run_it_caught() -> None:
    killed = history([publish("a", 1, 0), publish("b", 2, 10)],
                     [run("a", 1, 100, None, runner="a", outcome="cut"),
                      run("b", 2, 500, 550, runner="b"), run("a", 1, 560, 600, runner="b")],
                     faults=[Fault("kill", 300, 300, runner="a")])
    assert "I5" not in invariants(killed)


def test_lease_events_come_from_the_log_and_go_through_files(tmp_path: Path) -> None:
    import logging

    from sqlqueue import events

    record = logging.LogRecord("sqlqueue.leases", logging.DEBUG, "", 0, "x", (), None)
    record.__dict__.update(events.fields(
        events.LEASE, group="g", topic="t", partition="k", subscriber="a", change="renewed",
        generation=3, tenure=5, age_ms=40))
    event = lease_event(record, 1_000.0)
    assert event == LeaseEvent("g", "k", "a", "a", "renewed", 3, 5, 960.0)
    LeaseLines(tmp_path / "1.jsonl", runner="123").emit(record)
    (tmp_path / "2.jsonl").write_text('{"group": "g", "partit')  # cut short by a kill
    h = replace(BASE, leases=[])
    assert read_lines(sorted(tmp_path.glob("*.jsonl")), h) == 1
    assert h.leases[0].runner == "123" and h.leases[0].renewals == 1
    h.lease_ms = LEASE
    saved = tmp_path / "h.json"
    h.dump(saved)
    assert History.load(saved).leases == h.leases



def test_a_message_lost_in_a_failover_whose_offset_was_reused_is_not_undone() -> None:
    """After a failover to a replica that was behind, its offset names another message
    of the same partition: the lost one is the database's loss (no I3), the new one is
    checked by id (found by the async failover run, fed to the checker)."""
    lost = history([publish("a", 1, 0), publish("b", 2, 20), publish("c", 2, 900)],
                   [run("a", 1, 100, 150), run("c", 2, 1_000, 1_050)],
                   faults=[Fault("failover", 500, 800)])
    lost.final.stored = {("k", 1): "a", ("k", 2): "c"}
    lost.final.acked = {("g", "k", 1), ("g", "k", 2)}
    assert "I3" not in invariants(lost)
    unhandled = replace(lost, runs=lost.runs[:1])
    assert "I3" in invariants(unhandled)  # c, at the reused offset, is checked by id
