"""No public name is defined twice in sqlqueue with different meanings: a top-level
class, function, module constant or type alias appears in one module only (read from the
source), so a reader who meets ``DeliveryAccess``, ``unkeyed_partition`` or
``COUNT_CAP`` knows which one it is. A value that means the same in two places is
defined once and imported; two values that mean different things get two names."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue"

#: Django's and Python's conventions: name -> the folder (under sqlqueue/) where every
#: module defines it (each management command its ``Command``, each template tag library
#: its ``register``), or "" for anywhere (each module its own ``logger``)
CONVENTIONS = {"Command": "management/commands/", "register": "templatetags/", "logger": ""}
#: the ``type X = ...`` statement's node, on the Pythons that have one
TYPE_STATEMENT: tuple[type, ...] = tuple(
    node for node in (getattr(ast, "TypeAlias", None),) if node is not None)


def _names(statements: list[ast.stmt]) -> Iterator[str]:
    """The names that top-level ``statements`` bind: classes, functions, constants,
    aliases (also inside a top-level ``if`` or ``try``, e.g. ``if TYPE_CHECKING:``)."""
    for node in statements:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                yield from (e.id for e in elements if isinstance(e, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id
        elif isinstance(node, TYPE_STATEMENT):  # ``type X = ...`` (Python 3.12+)
            yield node.name.id  # type: ignore[attr-defined]
        elif isinstance(node, ast.If):
            yield from _names(node.body)
            yield from _names(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _names(node.body)
            for handler in node.handlers:
                yield from _names(handler.body)
            yield from _names(node.orelse)


def definitions() -> dict[str, list[str]]:
    """Public name -> the modules that define it (each once)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        module = str(path.relative_to(PACKAGE.parent))
        for name in dict.fromkeys(_names(ast.parse(path.read_text()).body)):
            if not name.startswith("_") and not _by_convention(name, module):
                where[name].append(module)
    return where


def _by_convention(name: str, module: str) -> bool:
    folder = CONVENTIONS.get(name)
    return folder is not None and f"sqlqueue/{folder}" in module


def test_no_public_name_is_defined_twice() -> None:
    twice = {name: paths for name, paths in definitions().items() if len(paths) > 1}
    assert twice == {}


def test_the_scan_sees_definitions() -> None:
    found = definitions()
    assert found["unkeyed_partition"] == ["sqlqueue/naming.py"]  # a function
    assert found["DeliveryState"] == ["sqlqueue/models/groups.py"]  # a class
    assert found["DEFAULT_PRIORITY"] == ["sqlqueue/naming.py"]  # a constant
    assert found["ConfigurationError"] == ["sqlqueue/exceptions.py"]  # under TYPE_CHECKING
    assert "Command" not in found and "logger" not in found  # conventions


def test_the_scan_sees_constants_and_aliases() -> None:
    source = ("A = 1\nB: int = 2\nC, D = 3, 4\nE: TypeAlias = int\nif X:\n    F = 5\n"
              "try:\n    G = 6\nexcept ImportError:\n    G = 7\n_H = 8\n")
    assert list(_names(ast.parse(source).body)) == ["A", "B", "C", "D", "E", "F", "G", "G",
                                                     "_H"]
