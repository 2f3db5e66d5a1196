"""The history checker on batch consumers' runs (issue 55), on hand-made histories: clean
batches (ordered and not, with a failure in the middle) pass, and each rule of
tests/history/batch_rules.py reports its violation by name."""

from __future__ import annotations

from dataclasses import replace

from tests.history.checker import check
from tests.history.model import DeadLetter, Fault, History, Run
from tests.unit.test_history_checker import history, publish, run

#: five messages of partition k, committed 100 ms apart (none found late), by -85
PUBLISHES = [publish(m, n, n * 100 - 600) for n, m in enumerate("abcde", start=1)]


def batch(name: str, ids: str, start: float, end: float | None, *, attempt: int = 1,
          outcomes: dict[str, str] | None = None, runner: str = "r1") -> list[Run]:
    """One call of a batch handler: a run per message, offsets from the ids (a=1 ...)."""
    return [replace(run(m, "abcde".index(m) + 1, start, end, attempt=attempt, runner=runner,
                        outcome=(outcomes or {}).get(m, "ok")), batch=name) for m in ids]


def invariants(h: History) -> list[str]:
    return [v.invariant for v in check(h)]


def test_an_ordered_batch_of_every_message_passes() -> None:
    # The five runs of one call overlap: that is no breach of I5's "never overlap".
    assert check(history(PUBLISHES, batch("r1-1", "abcde", 200, 250))) == []


def test_a_failure_in_an_ordered_batch_gives_the_rest_back_uncharged() -> None:
    """b fails: c, d and e are given back, neither acked nor charged, and run again (as
    attempt 1) after b's retry, in the next batch."""
    first = batch("r1-1", "abcde", 200, 250,
                  outcomes={"b": "fail", "c": "uncharged", "d": "uncharged", "e": "uncharged"})
    second = [*batch("r1-2", "b", 400, 420, attempt=2), *batch("r1-2", "cde", 400, 420)]
    # The history helper's acks are the ok runs': b's, c's ... in the second batch.
    h = history(PUBLISHES, [*first, *second])
    assert check(h) == []


def test_an_unordered_batch_may_mix_partitions_and_ack_after_a_failure() -> None:
    publishes = [*PUBLISHES[:2], publish("x", 1, 5, partition="j")]
    runs = [*batch("r1-1", "ab", 200, 250, outcomes={"a": "fail"}),
            replace(run("x", 1, 200, 250, partition="j"), batch="r1-1"),
            *batch("r1-2", "a", 400, 420, attempt=2)]
    assert check(history(publishes, runs, ordered=False)) == []


def test_an_ordered_batch_across_partitions_breaks_i5() -> None:
    publishes = [*PUBLISHES[:2], publish("x", 1, 5, partition="j")]
    runs = [*batch("r1-1", "ab", 200, 250),
            replace(run("x", 1, 200, 250, partition="j"), batch="r1-1")]
    found = check(history(publishes, runs))
    assert [v.invariant for v in found] == ["I5"]
    assert "mixes partitions j, k" in found[0].text


def test_an_ordered_batch_that_skips_a_waiting_message_breaks_i5() -> None:
    """c had committed (at -285) and was not done when the batch of a, b, d, e started."""
    runs = [*batch("r1-1", "abde", 200, 250), *batch("r1-2", "c", 300, 310)]
    found = check(history(PUBLISHES, runs))
    assert "I5" in [v.invariant for v in found]
    assert any("skips c (k@3)" in v.text for v in found)


def test_a_message_committed_after_the_batch_started_may_be_left_out() -> None:
    """A late commit (c committed at 500, below offsets already taken) is delivered after
    the run in flight: the batch before it did not skip it."""
    late = replace(PUBLISHES[2], commit_begun_ms=490, ended_ms=500)
    publishes = [*PUBLISHES[:2], late, *PUBLISHES[3:]]
    runs = [*batch("r1-1", "abde", 200, 250), *batch("r1-2", "c", 600, 610)]
    assert check(history(publishes, runs)) == []


def test_a_message_found_late_may_be_left_out() -> None:
    """c committed (at 150) after d and e had (at -185 and -85): a fetch may have read them
    without it; it starts after the call in flight."""
    late = replace(PUBLISHES[2], commit_begun_ms=145, ended_ms=150)
    publishes = [*PUBLISHES[:2], late, *PUBLISHES[3:]]
    runs = [*batch("r1-1", "abde", 200, 250), *batch("r1-2", "c", 300, 310)]
    assert check(history(publishes, runs)) == []


def test_acking_past_a_failure_in_an_ordered_batch_breaks_i5() -> None:
    runs = [*batch("r1-1", "abc", 200, 250, outcomes={"b": "fail"}),
            *batch("r1-2", "b", 400, 420, attempt=2)]
    found = check(history(PUBLISHES[:3], runs))
    assert [v.invariant for v in found] == ["I5"]
    assert "c came after b, which failed, but was ok" in found[0].text


def test_a_given_back_message_that_runs_before_the_failed_one_is_done_breaks_i5() -> None:
    """c, given back behind b, runs at 300; b's retry only ends well at 420."""
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "c", 300, 310), *batch("r1-3", "b", 400, 420, attempt=2)]
    h = history(PUBLISHES[1:3], runs)
    assert "I5" in invariants(h)
    assert any("given back behind b, ran again before b was done" in v.text
               for v in check(h))


def test_a_given_back_message_may_run_once_an_earlier_attempt_acked_the_failed_one() -> None:
    """b's first run outlives its visibility timeout (1,000 ms) and returns well at 1,500:
    a late ack, the message's. Its second delivery (from 1,500, with c) fails and gives c
    back; c runs again at 1,700, after b was done by that late ack (seed 186559736 of the
    randomized workload on SQLite, wave 4's seventh session)."""
    runs = [*batch("r1-1", "b", 200, 1_500),
            *batch("r1-2", "b", 1_500, 1_600, attempt=2, outcomes={"b": "fail"}),
            *batch("r1-2", "c", 1_500, 1_600, outcomes={"c": "uncharged"}),
            *batch("r1-3", "c", 1_700, 1_710)]
    assert check(history(PUBLISHES[1:3], runs)) == []
    # Without the late ack (b's first run failed too), c ran before b was done.
    failed_first = [replace(runs[0], outcome="fail"), *runs[1:]]
    assert any("c, given back behind b, ran again before b was done" in v.text
               for v in check(history(PUBLISHES[1:3], failed_first)))


def test_a_given_back_message_may_run_behind_the_failed_ones_retry_in_one_call() -> None:
    """b fails, c is given back; the next call holds b's retry and c after it (b fails
    again, c is given back again), then both run well."""
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "b", 400, 420, attempt=2, outcomes={"b": "fail"}),
            *batch("r1-2", "c", 400, 420, outcomes={"c": "uncharged"}),
            *batch("r1-3", "b", 800, 820, attempt=3), *batch("r1-3", "c", 800, 820)]
    assert check(history(PUBLISHES[1:3], runs)) == []


def test_a_given_back_message_may_run_once_the_failed_one_is_dead() -> None:
    """b fails its last attempt (3 of 3) and is dead-lettered: c, behind it, runs next."""
    runs = [*batch("r1-1", "bc", 200, 250, attempt=3,
                   outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "c", 300, 310, attempt=3)]
    h = history(PUBLISHES[1:3], runs, dead=[DeadLetter("g", "b", 3, "boom")])
    assert check(h) == []


def test_a_message_dead_lettered_unseen_may_be_left_out_of_a_batch() -> None:
    """c's attempts never completed (its runs were cut, 3 of 3): the dead letter was
    written when it was delivered once more, with no run; the batch after it skips it."""
    cut = [replace(r, finished_ms=None, outcome="cut") for r in batch("r1-1", "abc", 200,
                                                                       None)]
    runs = [*cut, *batch("r2-1", "abde", 2_000, 2_050, attempt=2)]
    faults = [Fault("kill", 210, 210, runner="r1")]
    h = history(PUBLISHES, runs, faults=faults, dead=[DeadLetter("g", "c", 4, "gave up")])
    assert check(h) == []
    assert "I5" in invariants(replace(h, final=replace(h.final, dead_letters=[])))


def test_a_given_back_message_charged_an_attempt_breaks_i7() -> None:
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "b", 400, 420, attempt=2), *batch("r1-3", "c", 430, 440,
                                                             attempt=2)]
    found = check(history(PUBLISHES[1:3], runs))
    assert [v.invariant for v in found] == ["I7"]
    assert "given back uncharged (attempt 1) but ran next as attempt 2" in found[0].text


def test_a_kill_during_the_batch_excuses_the_charge() -> None:
    """The runner was killed before the call's outcomes were written: the batch is
    delivered again as a whole after its visibility timeout, every message charged."""
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r2-1", "b", 1_300, 1_320, attempt=2, runner="r2"),
            *batch("r2-1", "c", 1_300, 1_320, attempt=2, runner="r2")]
    h = history(PUBLISHES[1:3], runs, faults=[Fault("kill", 255, 260, runner="r1")])
    assert "I7" not in invariants(h)
    assert "I7" in invariants(replace(h, faults=[]))


def test_a_kill_before_the_next_run_excuses_the_charge() -> None:
    """c was given back; r2 delivered it again (attempt 2) and was killed before its
    handler started: that attempt was charged, with no run; c runs next as attempt 3."""
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "b", 400, 420, attempt=2),
            *batch("r1-3", "c", 3_000, 3_020, attempt=3)]
    h = history(PUBLISHES[1:3], runs, faults=[Fault("kill", 1_000, 1_000, runner="r2")])
    assert "I7" not in invariants(h)


def test_a_call_that_outlived_its_timeout_may_have_its_given_back_messages_charged() -> None:
    """The call ran past its visibility timeout (1,000 ms after its start): what it gave
    back was delivered again after the timeout, as a new attempt."""
    runs = [*batch("r1-1", "bc", 200, 1_400, outcomes={"b": "fail", "c": "uncharged"}),
            *batch("r1-2", "b", 1_600, 1_620, attempt=2),
            *batch("r1-3", "c", 1_700, 1_720, attempt=2)]
    assert "I7" not in invariants(history(PUBLISHES[1:3], runs))


def test_an_atomic_call_rolled_back_in_between_may_have_its_messages_charged() -> None:
    """c was given back, then delivered again (attempt 1) in an atomic call that started
    near its visibility timeout's end: the timeout ran out, c was delivered again (attempt
    2), and the call's fenced acks rolled it back. The workload records that call cut (its
    commit would have settled it): c's next run after the give-back is attempt 1."""
    given_back = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"}),
                  *batch("r1-2", "b", 400, 420, attempt=2)]
    charged = batch("r1-4", "c", 1_950, 1_970, attempt=2)
    rolled_back = batch("r1-3", "c", 900, 910, outcomes={"c": "cut"})
    assert check(history(PUBLISHES[1:3], [*given_back, *rolled_back, *charged])) == []
    assert invariants(history(PUBLISHES[1:3], [*given_back, *charged])) == ["I7"]


def test_an_atomic_calls_cut_runs_are_settled_by_its_commit() -> None:
    h = history(PUBLISHES[1:3], batch("r1-1", "b", 200, 250))
    cut = batch("r1-2", "c", 300, 310, outcomes={"c": "cut"})
    for cut_run in cut:
        h.ran(cut_run)
    settled = batch("r1-2", "c", 300, 320)
    h.settled(cut, settled)
    assert [r.batch for r in h.runs] == ["r1-1", "r1-2"]
    assert [r.outcome for r in h.runs] == ["ok", "ok"]


def test_an_uncharged_run_without_a_failure_before_it_breaks_i5() -> None:
    runs = [*batch("r1-1", "bc", 200, 250, outcomes={"b": "uncharged"}),
            *batch("r1-2", "b", 300, 310)]
    found = check(history(PUBLISHES[1:3], runs))
    assert [v.invariant for v in found] == ["I5"]
    assert "gave b back with no failure before it" in found[0].text


def test_batch_runs_survive_the_history_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "history.json"
    runs = batch("r1-1", "bc", 200, 250, outcomes={"b": "fail", "c": "uncharged"})
    h = history(PUBLISHES[1:3], runs)
    h.dump(path)
    assert History.load(path).runs == h.runs
