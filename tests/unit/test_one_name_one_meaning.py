"""No public name is defined twice in sqlqueue with different meanings: a top-level
class or function name appears in one module only (read from the source), so a reader
who meets ``DeliveryAccess`` or ``unkeyed_partition`` knows which one it is."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue"

#: Django's convention: every management command module defines ``Command``
CONVENTIONS = {"Command"}


def definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                    and not node.name.startswith("_")):
                where[node.name].append(str(path.relative_to(PACKAGE.parent)))
    return where


def test_no_public_name_is_defined_twice() -> None:
    twice = {name: paths for name, paths in definitions().items()
             if len(paths) > 1 and name not in CONVENTIONS}
    assert twice == {}


def test_the_scan_sees_definitions() -> None:
    found = definitions()
    assert found["unkeyed_partition"] == ["sqlqueue/naming.py"]
    assert len(found["Command"]) >= 2
