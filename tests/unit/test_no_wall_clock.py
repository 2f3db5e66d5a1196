"""Tests do not race the wall clock (issue 40): no assertion that something took less than
a few seconds, and no fixed ``time.sleep`` in a test's own body to wait for something to
happen. Read from the source with ``ast`` (no Django needed).

What is flagged:

* an upper bound (``<``, ``<=``, ``assertLess``) on an elapsed time below
  ``HANG_BOUND`` seconds: ``time.monotonic() - started < 5``, ``took < 8``. A loaded
  machine fails those. Waits on a condition (``wait_for``, ``run_until``) with a deadline
  are not assertions on elapsed time; a bound of ``HANG_BOUND`` or more only ends a hang.
  How fast something is belongs in bench/.
* ``time.sleep(...)`` as a statement of a ``test_*`` function's own body, outside any
  loop: a fixed wait for something to happen. Sleeps inside a polling loop (the wait for a
  condition), inside a handler or helper defined in the test (the work it simulates) and
  in fixtures are not flagged.

Lower bounds (``elapsed >= 0.2``: never early) are left alone: a slow machine only adds.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: Seconds. An upper bound on an elapsed time at least this long only ends a hang.
HANG_BOUND = 60
#: Names of variables that hold an elapsed time in the tests.
ELAPSED_NAMES = {"took", "elapsed", "duration", "spent"}
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}

#: (path, line) allowed, each with its reason.
ALLOWED: dict[tuple[str, int], str] = {
    ("tests/acceptance/test_async_failover.py", 173):
        "the replica's lag is the scenario (the fault), not a wait for something to happen",
}


def python_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def _is_clock_call(node: ast.AST) -> bool:
    """``time.monotonic()``, ``monotonic()``, ``time.perf_counter()``..."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in CLOCKS


def _is_elapsed(node: ast.AST) -> bool:
    """An expression that is an elapsed time: ``clock() - x`` or a variable so named."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _is_clock_call(node.left)
    return isinstance(node, ast.Name) and node.id in ELAPSED_NAMES


def _short_bound(node: ast.AST) -> bool:
    """A bound that is not a plain number of ``HANG_BOUND`` seconds or more."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return True  # computed (``SLOW_POLL / 3``, ``renewals * interval + 1``)
    return not isinstance(value, int | float) or value < HANG_BOUND


def _upper_bounds(tree: ast.AST) -> list[int]:
    """Lines of asserts that an elapsed time is below a short bound."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            for compare in ast.walk(node.test):
                if not isinstance(compare, ast.Compare):
                    continue
                operands = [compare.left, *compare.comparators]
                for op, (left, right) in zip(compare.ops, itertools.pairwise(operands),
                                             strict=True):
                    if ((isinstance(op, ast.Lt | ast.LtE) and _is_elapsed(left)
                         and _short_bound(right))
                            or (isinstance(op, ast.Gt | ast.GtE) and _is_elapsed(right)
                                and _short_bound(left))):
                        lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("assertLess", "assertLessEqual") and node.args
              and _is_elapsed(node.args[0]) and _short_bound(node.args[1])):
            lines.append(node.lineno)
    return lines


def _is_sleep(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "sleep"
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id == "time")


def _own_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A function's statements outside loops and nested definitions (``with``, ``try``
    and ``if`` blocks included)."""
    found: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, ast.For | ast.While | ast.AsyncFor | ast.FunctionDef
                      | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        found.append(statement)
        for field in ("body", "orelse", "finalbody"):
            found.extend(_own_statements(getattr(statement, field, []) or []))
        for handler in getattr(statement, "handlers", []) or []:
            found.extend(_own_statements(handler.body))
    return found


def _fixed_sleeps(tree: ast.AST) -> list[int]:
    """Lines of ``time.sleep`` statements in a test function's own body, outside loops."""
    return [statement.lineno for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
            for statement in _own_statements(node.body) if _is_sleep(statement)]


def findings() -> dict[tuple[str, int], str]:
    found: dict[tuple[str, int], str] = {}
    for path in python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        name = str(path.relative_to(ROOT))
        for line in _upper_bounds(tree):
            found[(name, line)] = "asserts an elapsed time is below a short bound"
        for line in _fixed_sleeps(tree):
            found[(name, line)] = "a fixed time.sleep in a test's own body"
    return found


def test_the_scan_sees_the_tests() -> None:
    assert Path(__file__) in python_files()
    assert TESTS / "integration" / "test_consuming.py" in python_files()


def test_the_scan_finds_what_it_looks_for() -> None:
    source = '''
def test_races() -> None:
    started = time.monotonic()
    time.sleep(0.3)
    assert time.monotonic() - started < 5
    assert took <= 2 * interval + 1.0
    assert 0.2 <= time.monotonic() - started < 10
    self.assertLess(time.monotonic() - started, 1.0)

def test_waits_on_conditions() -> None:
    while not done():
        time.sleep(0.01)
    assert time.monotonic() - started >= 0.2
    assert took < 60, "a hang"

    def handler(message) -> None:
        time.sleep(0.05)
'''
    tree = ast.parse(source)
    assert sorted(_upper_bounds(tree)) == [5, 6, 7, 8]
    assert _fixed_sleeps(tree) == [4]


def test_no_test_races_the_wall_clock() -> None:
    unexpected = {f"{path}:{line}": why for (path, line), why in findings().items()
                  if (path, line) not in ALLOWED}
    assert unexpected == {}, (
        "wait on a condition, inject the clock (Runner(clock=...)), count passes or "
        "queries, or bound only a hang (at least HANG_BOUND s, saying what did not happen); "
        f"speed belongs in bench/: {unexpected}")


def test_the_allow_list_is_current() -> None:
    assert set(ALLOWED) <= set(findings()), "remove what was fixed from ALLOWED"
