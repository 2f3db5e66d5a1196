"""One writer per thread for a partition's window (issue 54).

A window (``PartitionState`` and its ``Entry`` objects, consuming/partition.py) changes
only through the PartitionState's methods, each of which checks first that it runs on
the thread that made the state (``_writing``; on in every test process: tests/conftest.py).
Handler threads never change it: ``extend_visibility()`` writes the delivery's ``Hold``,
which the entry reads. Which parts call the changing methods is the table "Who changes a
window" of docs/internals.md, read here from the source with ``ast``; the HeldView (the
handler threads' side) and handlers.py are not in it.

test_no_window_method_is_called_for_a_handler_thread and test_an_entry_has_no_changing_method
fail on the code before this rule (``HeldView.hold`` called ``Entry.hold_until``).
"""

from __future__ import annotations

import ast
import os
import re
import threading
from pathlib import Path
from typing import Any

from sqlqueue.consuming import partition
from sqlqueue.consuming.delivering import HeldView
from sqlqueue.consuming.handlers import Delivery
from sqlqueue.consuming.partition import Hold, PartitionState, WindowWrittenElsewhere
from tests.unit.test_consuming_units import row

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sqlqueue"
WINDOW = PACKAGE / "consuming" / "partition.py"
DOC = ROOT / "docs" / "internals.md"
SECTION = "## Who changes a window"
#: the window's classes
WINDOW_CLASSES = ("PartitionState", "Entry")
#: the modules that handle windows (a call of a method of the same name elsewhere is
#: another class's)
USERS = ("consuming/", "testing/")
#: receivers whose methods share a name with a window's (``instruments.finished``)
NOT_WINDOWS = {"instruments"}
MUTATING = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "add",
            "discard", "update", "setdefault"}


def _writes_an_attribute(function: ast.FunctionDef) -> bool:
    """Does ``function`` assign (or delete, or change by a mutating call) any
    ``<something>.attr`` (``self.entries[k] = ...``, ``entry.done = ...``)?"""
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATING):
            targets = [node.func.value]
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                while isinstance(element, ast.Subscript):
                    element = element.value
                if isinstance(element, ast.Attribute):
                    return True
    return False


def _self_calls(function: ast.FunctionDef) -> set[str]:
    return {node.func.attr for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"}


def window_methods() -> dict[str, dict[str, ast.FunctionDef]]:
    tree = ast.parse(WINDOW.read_text())
    return {node.name: {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            for node in tree.body
            if isinstance(node, ast.ClassDef) and node.name in WINDOW_CLASSES}


def changing_methods(cls: str) -> set[str]:
    """The methods of ``cls`` that change the window, directly or through another of its
    methods (``ready`` prunes the overtaken runs through ``_next_in_order``)."""
    methods = window_methods()[cls]
    changing = {name for name, f in methods.items()
                if name != "__post_init__" and _writes_an_attribute(f)}
    grew = True
    while grew:
        more = {name for name, f in methods.items() if _self_calls(f) & changing}
        grew = not more <= changing
        changing |= more
    return changing


def _receiver(method: ast.Attribute) -> str:
    """The last name of what a method is called on (``self.instruments.finished``:
    ``instruments``)."""
    value = method.value
    return (value.id if isinstance(value, ast.Name)
            else value.attr if isinstance(value, ast.Attribute) else "")


def _callers_in(tree: ast.Module, names: set[str], module: str) -> set[tuple[str, str]]:
    """(the calling class, or ``module:function``; the method) of each call
    ``<x>.method(...)`` of one of ``names`` on something other than ``self``."""
    found = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not where:
                visit(child, f"{module}:{child.name}")
            else:
                if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                        and child.func.attr in names
                        and _receiver(child.func) not in {"self", *NOT_WINDOWS}):
                    found.add((where or module, child.func.attr))
                visit(child, where)

    visit(tree, "")
    return found


def window_writers() -> dict[str, set[str]]:
    """The part (class) -> the window's methods it calls that change the window."""
    names = changing_methods("PartitionState") | changing_methods("Entry")
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        if path == WINDOW or not module.startswith(USERS):
            continue
        for where, method in _callers_in(ast.parse(path.read_text()), names, module):
            found.setdefault(where, set()).add(method)
    return found


def documented() -> dict[str, set[str]]:
    """The doc's table: | Part | `method`, `method` | why |"""
    text = DOC.read_text()
    assert SECTION in text, f"docs/internals.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return {part: set(re.findall(r"`(\w+)`", methods)) for part, methods in
            re.findall(r"^\| (\w[\w.:/]*) \| ([^|]*) \|", section, flags=re.MULTILINE)
            if part != "part"}


def test_the_scan_sees_the_window_methods() -> None:
    assert {"absorb", "dispatched", "finished", "moved_watermark", "adopt",
            "visible_again_at", "ready"} <= changing_methods("PartitionState")
    assert not {"overdue", "advance_candidate", "busy", "wants_fetch"} & changing_methods(
        "PartitionState")


def test_every_changing_method_checks_its_thread() -> None:
    methods = window_methods()["PartitionState"]
    direct = {name for name, f in methods.items()
              if name != "__post_init__" and _writes_an_attribute(f)}
    unchecked = sorted(name for name in direct if "_writing" not in _self_calls(methods[name]))
    assert unchecked == [], "call self._writing() first in these"


def test_an_entry_has_no_changing_method() -> None:
    """An Entry changes only through its PartitionState (which checks the thread)."""
    assert sorted(changing_methods("Entry")) == []


def test_the_window_writers_are_the_documented_ones() -> None:
    assert window_writers() == documented(), (
        "update the table 'Who changes a window' of docs/internals.md")


def test_no_window_method_is_called_for_a_handler_thread() -> None:
    """The HeldView answers handler threads and handlers.py runs on them: neither
    changes a window (nor does the pool's thread side)."""
    writers = window_writers()
    assert "HeldView" not in writers
    assert not [where for where in writers if where.startswith("consuming/handlers.py")]
    handlers = ast.parse((PACKAGE / "consuming" / "handlers.py").read_text())
    changing = changing_methods("PartitionState") | changing_methods("Entry")
    assert _callers_in(handlers, changing, "handlers") == set()


def test_the_check_is_on_in_the_tests() -> None:
    assert os.environ[partition.CHECK_WRITER_VARIABLE] == "1"
    assert PartitionState("p", 0).writer == threading.get_ident()


def _on_another_thread(call: Any) -> BaseException | None:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed back to the test
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


def test_a_window_changed_on_another_thread_is_refused() -> None:
    state = PartitionState("p", 0)
    state.absorb([row(1), row(2)], "g")
    for change in (lambda: state.finished(1), lambda: state.absorb([row(3)], "g"),
                   lambda: state.moved_watermark(1), lambda: state.retry_at(2, 0)):
        error = _on_another_thread(change)
        assert isinstance(error, WindowWrittenElsewhere)
        assert "'p'" in str(error)
    assert sorted(state.entries) == [1, 2] and not state.entries[1].done


def delivered(state: PartitionState, offset: int, now_ms: int,
              timeout_ms: int) -> Delivery:
    entry = state.entries[offset]
    hold = Hold()
    state.dispatched(entry, now_ms + timeout_ms, hold)
    assert entry.row is not None
    return Delivery(None, "default", state.partition_key, entry.row,  # type: ignore[arg-type]
                    entry.attempt, 1, hold=hold)


class Leases:
    """The LeaseKeeper's answers a HeldView needs: held, in tenure None."""

    def holds(self, key: str) -> bool:
        return True

    def tenure(self, key: str) -> int | None:
        return None


def test_a_hold_on_a_handler_thread_protects_the_delivery_at_once() -> None:
    """``extend_visibility()`` on the handler thread: the window is not written there,
    yet neither the handler's own check nor the main thread's next judgement sees the
    delivery as expired past its first timeout (guarantee I10)."""
    now = {"ms": 1_000}
    state = PartitionState("p", 0)
    state.absorb([row(1)], "g")
    delivery = delivered(state, 1, now["ms"], 500)
    view = HeldView(Leases(), {"p": state}, lambda: now["ms"])  # type: ignore[arg-type]
    assert _on_another_thread(lambda: view.hold(delivery, 5.0)) is None
    now["ms"] = 2_000  # past the first timeout (1,500), within the hold (6,000)
    assert view.may_start(delivery)
    assert state.ready(now["ms"], 10, ordered=False) == []
    assert state.ready(now["ms"], 10, ordered=True) == []
    now["ms"] = 6_000
    assert not view.may_start(delivery)
    assert [e.offset for e in state.ready(now["ms"], 10, ordered=False)] == [1]


def test_a_hold_of_an_earlier_attempt_does_not_hold_the_redelivery() -> None:
    state = PartitionState("p", 0)
    state.absorb([row(1)], "g")
    first = delivered(state, 1, 1_000, 500)
    second = delivered(state, 1, 2_000, 500)  # the first ran past its timeout
    view = HeldView(Leases(), {"p": state}, lambda: 2_100)  # type: ignore[arg-type]
    assert _on_another_thread(lambda: view.hold(first, 60.0)) is None
    assert state.entries[1].held_until_ms == 0 and second.hold.until_ms == 0
    assert [e.offset for e in state.ready(2_600, 10, ordered=False)] == [1]


def test_an_adopted_entry_reads_its_delivery_hold() -> None:
    """After a rebuilt view the entry is read again: adopted, it reads the hold of the
    delivery still running, which its handler may extend again."""
    state = PartitionState("p", 0)
    state.absorb([row(1, retry_count=0, invisible_until=1_500)], "g")
    hold = Hold()
    state.adopt(state.entries[1], hold)
    hold.push_back(9_000)
    assert state.ready(5_000, 10, ordered=False) == []

