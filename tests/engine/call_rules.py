"""The rules a call tree of the engine is held to (issue 54), shared by the tracer tests
on the in-memory database (tests/unit/test_pass_is_a_tree.py) and on the tier's database
(tests/integration/test_call_trees.py): acyclic apart from named callbacks, calls down the
ranks, two storage files with matching names per statement, ceilings per tree."""

from __future__ import annotations

from collections.abc import Iterable

from tests.engine.calltrace import CallTree

#: Callbacks a tree may make back into a file that called it: (caller file, callee file,
#: function). Each is a function handed down on purpose.
CALLBACKS = frozenset({
    # The retry helper runs the publish's attempt again after a deadlock victim.
    ("storage/retry.py", "publishing/api.py", "<lambda>"),
    # A Delivery asks the HeldView it was given whether its lease still lets it start,
    # and holds its entry (the handler thread's only view of the window).
    ("consuming/handlers.py", "consuming/delivering.py", "may_start"),
    ("consuming/handlers.py", "consuming/delivering.py", "hold"),
    # The database clock re-anchors by asking the server (the ServerWatch's reader, given
    # to it at construction), and the ServerWatch reads the host clock defined there.
    ("consuming/clock.py", "consuming/server.py", "database_now"),
    # The settled-before cache reads the write horizon through the reader it is given.
    ("horizon.py", "consuming/settling.py", "<lambda>"),
})
#: Callbacks from anywhere, as (callee file, function): the ServerWatch's execute
#: wrappers, which Django calls for every statement the runner's connection runs.
CALLBACKS_FROM_ANYWHERE = frozenset({
    ("consuming/server.py", "count_statement"),
    ("consuming/server.py", "bound_transaction_lock_waits"),
})


def is_callback(caller: str, callee: str, function: str) -> bool:
    return ((caller, callee, function) in CALLBACKS
            or (callee, function) in CALLBACKS_FROM_ANYWHERE)

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
                     "consuming/backoff.py", "consuming/failure_text.py",
                     "consuming/workqueue.py"), 4),
    **dict.fromkeys(("consuming/server.py", "consuming/clock.py", "consuming/takeover.py",
                     "horizon.py"), 5),
    "publishing/api.py": 0,
    **dict.fromkeys(("publishing/messages.py", "publishing/wakeups.py"), 1),
    "wakeups/__init__.py": 2,
}
STORAGE_RANK = 6

#: A vendor's own layer beside the subjects' files: its store class, its prepared
#: statements, its variants of a subject's builders. It may stand for a subject's
#: executor (MySQL's insert, PostgreSQL's COPY) or builder (PostgreSQL's own texts).
VENDOR_EXECUTORS = frozenset({"storage/sql/mysql.py", "storage/sql/postgresql.py",
                              "storage/sql/sqlite.py", "storage/sql/prepared.py"})
VENDOR_BUILDERS = frozenset({"storage/statements/postgresql.py"})
#: the row types every executor builds its answers with (storage/sql/tables.py)
SHARED_ROWS = frozenset({"storage/sql/tables.py"})


def _crossings(*groups: tuple[str, ...]) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(f"storage/{f}" for f in group) for group in groups)


#: What still crosses otherwise, by vendor: a builder reached with no executor in the
#: trace (the session settings a connection gets when it opens, and MySQL's server
#: identity read on the lease path).
NOT_MIRRORED_YET: dict[str, frozenset[frozenset[str]]] = {
    "sqlite": _crossings(("statements/sessions.py",)),
    "mysql": _crossings(("statements/sessions.py",), ("statements/failover.py",)),
}
#: Cycles among storage's own files, by vendor (storage's layout; h54s's split)
STORAGE_CYCLES: dict[str, set[tuple[str, ...]]] = {
    "postgresql": {("storage/statements/postgresql.py", "storage/statements/vendors.py")},
}
#: storage files every statement may pass through: the accessor (``store()``) and the
#: builders' shared vendor helpers
STORAGE_ACCESS = frozenset({"storage/__init__.py", "storage/sql/__init__.py",
                            "storage/statements/__init__.py",
                            "storage/statements/vendors.py"})

#: the most files of the package a tree may touch (publish: all; a pass: consuming/;
#: a handler run: all). A pass's 21st is the handler threads' work queue (a leaf data
#: structure, consuming/workqueue.py: a pass's deliveries put in under one lock).
CEILINGS = {"publish": 10, "pass": 21, "handler": 7}


def rank(path: str) -> int | None:
    return STORAGE_RANK if path.startswith("storage/") else RANKS.get(path)


def cycles(trees: Iterable[tuple[str, CallTree]]) -> list[tuple[str, list[list[str]]]]:
    """The trees whose file graph has a cycle that is not a named callback. Cycles among
    storage's own files (the SQL stores and their shared helpers, e.g.
    ``statements/postgresql.py`` and ``statements/vendors.py``) are storage's layout,
    not the engine's, and left to ``storage_cycles``."""
    return [(kind, found) for kind, tree in trees
            if (found := [c for c in tree.cycles(is_callback)
                          if not all(f.startswith("storage/") for f in c)])]


def storage_cycles(trees: Iterable[tuple[str, CallTree]]) -> set[tuple[str, ...]]:
    """Cycles among storage's own files."""
    return {tuple(c) for _, tree in trees for c in tree.cycles(is_callback)
            if all(f.startswith("storage/") for f in c)}


def upward_calls(trees: Iterable[tuple[str, CallTree]],
                 ) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Calls from a file to one of a lower rank number that are not named callbacks."""
    upward = set()
    for kind, tree in trees:
        for (caller, callee), functions in tree.edges.items():
            low, high = rank(caller), rank(callee)
            named = all(is_callback(caller, callee, f) for f in functions)
            if low is not None and high is not None and high < low and not named:
                upward.add((kind, caller, callee, tuple(sorted(functions))))
    return upward


def storage_crossings(trees: Iterable[tuple[str, CallTree]]) -> list[set[str]]:
    """The storage files each statement crossed (the accessor and the vendor helpers
    left out): each call into storage that reached a builder of ``storage/statements``."""
    crossed = [files - STORAGE_ACCESS for _, tree in trees for files in tree.statements]
    return [files for files in crossed
            if any(f.startswith("storage/statements/") for f in files)]


def mismatched_statements(trees: Iterable[tuple[str, CallTree]]) -> set[frozenset[str]]:
    """The statements that crossed other than one subject's executor and its builder of
    the same name (``storage/sql/<x>.py`` and ``storage/statements/<x>.py``), where the
    vendor's own layer may stand for either side, as the set of storage files each
    crossed."""
    wrong = set()
    for files in storage_crossings(trees):
        subject = files - VENDOR_EXECUTORS - VENDOR_BUILDERS - SHARED_ROWS
        executors = {f.rsplit("/", 1)[1] for f in subject if f.startswith("storage/sql/")}
        builders = {f.rsplit("/", 1)[1] for f in subject if f.startswith("storage/statements/")}
        executors = executors or ({"vendor"} if files & VENDOR_EXECUTORS else set())
        builders = builders or ({"vendor"} if files & VENDOR_BUILDERS else set())
        if (len(executors) != 1 or len(builders) != 1
                or ("vendor" not in executors | builders and executors != builders)):
            wrong.add(frozenset(files))
    return wrong


def over_ceiling(trees: Iterable[tuple[str, CallTree]]) -> list[tuple[str, list[str]]]:
    """The trees that touch more files than their kind's ceiling (a pass: of consuming/)."""
    over = []
    for kind, tree in trees:
        files = tree.files if kind != "pass" else {
            f for f in tree.files if f.startswith("consuming/")}
        if len(files) > CEILINGS[kind]:
            over.append((kind, sorted(files)))
    return over
