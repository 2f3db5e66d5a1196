"""A message's life is three call trees (issue 54, replacing issue 40's "at most 8 files
with no return"): the publish, the runner's passes (fetch and mark; record the ack; move
the watermark) and the handler run. One message is stepped through the engine on the
in-memory database (tests/engine) under a call tracer (``sys.setprofile``,
tests/engine/calltrace.py), and each tree must be a tree of files:

* its file-level call graph is acyclic, apart from the callbacks named in ``CALLBACKS``;
* calls go down the ownership ranks (``RANKS``: the runner, its parts, the subscriber,
  its parts, the window and the records, the server and the clock, storage);
* a statement crosses exactly two storage files with matching names
  (``storage/sql/<x>.py`` runs ``storage/statements/<x>.py``; ``STORAGE_MISMATCHES``
  lists the executors that do not mirror their builders yet);
* no tree grows past its ceiling (``CEILINGS``).

The rules are in tests/engine/call_rules.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqlqueue import send_message
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from tests.engine.call_rules import (
    cycles,
    mismatched_statements,
    over_ceiling,
    upward_calls,
)
from tests.engine.calltrace import CallTree, traced
from tests.engine.harness import ALIASES, memory_queue

TOPIC = "trace.t"

@pytest.fixture(scope="module")
def trees() -> Iterator[list[tuple[str, CallTree]]]:
    """One message's three kinds of tree: the publish, every pass until its watermark
    moved, and the handler run."""
    handled: list[str] = []
    with memory_queue() as queue:
        consumer(TOPIC, group="trace")(lambda message: handled.append(message.id))
        try:
            runner = queue.runner(select_consumers(["trace"], [TOPIC]))
            found = [("publish", traced(lambda: send_message(
                TOPIC, 1, partition_key="p0", id="m1", using=ALIASES[0])))]
            for _ in range(6):
                found.append(("pass", traced(runner.run_once)))
                if not runner.pool.work.empty():
                    found.append(("handler", traced(runner.pool.run_handed_out)))
                queue.clock.advance(50)
            moved = queue.tables.watermarks
        finally:
            unregister("trace", TOPIC)
    assert handled == ["m1"]
    assert moved, "the watermark moved over the ack"
    assert [kind for kind, _ in found].count("handler") == 1
    yield found


def test_each_tree_is_acyclic_apart_from_named_callbacks(trees) -> None:
    assert cycles(trees) == []


def test_calls_go_down_the_ranks(trees) -> None:
    assert upward_calls(trees) == set()


def test_every_statement_crosses_two_storage_files_with_matching_names(trees) -> None:
    # The in-memory store answers the engine's statements itself; the tier's database
    # runs them all (tests/integration/test_call_trees.py).
    assert mismatched_statements(trees) == set()


def test_no_tree_grows_past_its_ceiling(trees) -> None:
    assert over_ceiling(trees) == []


def test_the_tracer_sees_what_it_is_asked_about(trees) -> None:
    """The rules above hold of something: the trees are not empty, and a callback or an
    upward call would be seen (the retry helper's, in every publish)."""
    publish = next(tree for kind, tree in trees if kind == "publish")
    assert ("storage/retry.py", "publishing/api.py") in publish.edges
    assert publish.cycles() == [["publishing/api.py", "storage/retry.py"]]
    first_pass = next(tree for kind, tree in trees if kind == "pass")
    assert {"consuming/runner.py", "consuming/subscriber.py",
            "consuming/leases.py", "consuming/delivering.py"} <= first_pass.files
