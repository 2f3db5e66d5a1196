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
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqlqueue import send_message
from sqlqueue.consuming.registry import consumer, select_consumers, unregister
from tests.engine.calltrace import CallTree, traced
from tests.engine.harness import ALIASES, memory_queue

TOPIC = "trace.t"

#: Callbacks a tree may make back into a file that called it: (caller file, callee file,
#: function). Each is a function handed down on purpose.
CALLBACKS = frozenset({
    # The retry helper runs the publish's attempt again after a deadlock victim.
    ("storage/retry.py", "publishing/api.py", "<lambda>"),
    # A Delivery asks the HeldView it was given whether its lease still lets it start,
    # and holds its entry (the handler thread's only view of the window).
    ("consuming/handlers.py", "consuming/delivering.py", "may_start"),
    ("consuming/handlers.py", "consuming/delivering.py", "hold"),
})

#: Who may call whom: a file calls only files of its rank or a higher number. Files not
#: listed are not ranked (the trees' acyclicity still holds them).
RANKS: dict[str, int] = {
    "consuming/runner.py": 0,
    **dict.fromkeys(("consuming/pacing.py", "consuming/handoff.py", "consuming/gc.py",
                     "consuming/pauses.py", "consuming/settling.py", "consuming/exiting.py",
                     "testing/inline.py"), 1),
    "consuming/subscriber.py": 2,
    **dict.fromkeys(("consuming/leases.py", "consuming/discovery.py",
                     "consuming/delivering.py", "consuming/watermarks.py",
                     "consuming/recorder.py", "consuming/ledger.py",
                     "consuming/earlier_runs.py", "consuming/rollup.py"), 3),
    **dict.fromkeys(("consuming/partition.py", "consuming/recording.py",
                     "consuming/outcomes.py", "consuming/handlers.py", "consuming/message.py",
                     "consuming/limits.py", "consuming/logholding.py",
                     "consuming/backoff.py", "consuming/failure_text.py"), 4),
    **dict.fromkeys(("consuming/server.py", "consuming/clock.py", "consuming/takeover.py",
                     "horizon.py"), 5),
    "publishing/api.py": 0,
    **dict.fromkeys(("publishing/messages.py", "publishing/wakeups.py"), 1),
    "wakeups/__init__.py": 2,
}
STORAGE_RANK = 6

#: Executor modules that run another module's builders, as (executor, builder): the
#: store interface's split (h54s) removes them; empty it then.
STORAGE_MISMATCHES: frozenset[tuple[str, str]] = frozenset({
    ("storage/sql/delivery.py", "storage/statements/watermarks.py"),
    ("storage/sql/leases.py", "storage/statements/membership.py"),
})
#: storage files every statement may pass through: the accessor (``store()``) and the
#: store's base class
STORAGE_ACCESS = frozenset({"storage/__init__.py", "storage/sql/__init__.py",
                            "storage/sql/base.py"})

#: the most files of the package a tree may touch (publish: all; a pass: consuming/;
#: a handler run: all)
CEILINGS = {"publish": 10, "pass": 20, "handler": 7}


def rank(path: str) -> int | None:
    return STORAGE_RANK if path.startswith("storage/") else RANKS.get(path)


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
    for kind, tree in trees:
        assert tree.cycles(CALLBACKS) == [], (kind, tree.cycles(CALLBACKS))


def test_calls_go_down_the_ranks(trees) -> None:
    upward = set()
    for kind, tree in trees:
        for (caller, callee), functions in tree.edges.items():
            low, high = rank(caller), rank(callee)
            named = all((caller, callee, f) in CALLBACKS for f in functions)
            if low is not None and high is not None and high < low and not named:
                upward.add((kind, caller, callee, tuple(sorted(functions))))
    assert upward == set()


def test_every_statement_crosses_two_storage_files_with_matching_names(trees) -> None:
    crossed = [files - STORAGE_ACCESS for _, tree in trees for files in tree.statements]
    for files in crossed:
        if not any(f.startswith("storage/statements/") for f in files):
            continue  # the store answered itself (the in-memory store)
        executors = sorted(f for f in files if f.startswith("storage/sql/"))
        builders = sorted(f for f in files if f.startswith("storage/statements/"))
        assert len(executors) == 1 and len(builders) == 1, files
        pair = (executors[0], builders[0])
        assert (pair[0].rsplit("/", 1)[1] == pair[1].rsplit("/", 1)[1]
                or pair in STORAGE_MISMATCHES), pair


def test_no_tree_grows_past_its_ceiling(trees) -> None:
    for kind, tree in trees:
        files = tree.files if kind != "pass" else {
            f for f in tree.files if f.startswith("consuming/")}
        assert len(files) <= CEILINGS[kind], (kind, sorted(files))


def test_the_tracer_sees_what_it_is_asked_about(trees) -> None:
    """The rules above hold of something: the trees are not empty, and a callback or an
    upward call would be seen (the retry helper's, in every publish)."""
    publish = next(tree for kind, tree in trees if kind == "publish")
    assert ("storage/retry.py", "publishing/api.py") in publish.edges
    assert publish.cycles() == [["publishing/api.py", "storage/retry.py"]]
    first_pass = next(tree for kind, tree in trees if kind == "pass")
    assert {"consuming/runner.py", "consuming/subscriber.py",
            "consuming/leases.py", "consuming/delivering.py"} <= first_pass.files
