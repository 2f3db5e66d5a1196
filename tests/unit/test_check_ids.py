"""Each system check id of sqlqueue/checks/ is made by one function, and each function
makes one id (issue 54: checks split by concern, one function per check id), with the
registration with Django in one place. Read from the source with ``ast`` (no Django)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "sqlqueue" / "checks"
DOC = ROOT / "docs" / "reference" / "checks.md"
CHECK_ID = re.compile(r"sqlqueue\.[EW]\d{3}")
#: ids made outside sqlqueue/checks/, which its functions report as they come: settings
#: problems found by conf.validate, schedule problems by scheduling.validation, and the
#: Tasks backend's own E201 (raised by Django's Tasks framework)
ELSEWHERE = ("conf.py", "setting_converters.py", "scheduling", "integrations/tasks")
#: id -> why it is made by one function in each vendor's module
PER_VENDOR = {
    "sqlqueue.E103": "text that is not UTF-8: the MySQL connection's character set, the "
                     "PostgreSQL database's encoding (two facts read differently)",
}


def made_by() -> dict[str, set[str]]:
    """id -> the functions (module:function) that pass it as ``id=``."""
    makers: dict[str, set[str]] = defaultdict(set)
    for path in sorted(CHECKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in ast.walk(node):
                for keyword in getattr(call, "keywords", []):
                    if (isinstance(call, ast.Call) and keyword.arg == "id"
                            and isinstance(keyword.value, ast.Constant)):
                        makers[keyword.value.value].add(f"{path.stem}:{node.name}")
    return makers


def test_each_check_id_is_made_by_one_function() -> None:
    assert {i: f for i, f in made_by().items() if len(f) > 1 and i not in PER_VENDOR} == {}
    assert made_by()["sqlqueue.E103"] == {"mysql:charset_not_utf8mb4",
                                          "postgresql:encoding_not_utf8"}


def test_each_function_makes_one_check_id() -> None:
    ids_of: dict[str, set[str]] = defaultdict(set)
    for check_id, functions in made_by().items():
        for function in functions:
            ids_of[function].add(check_id)
    assert {f: i for f, i in ids_of.items() if len(i) > 1} == {}


def test_every_documented_id_is_made_here_or_where_its_problem_is_found() -> None:
    documented = set(CHECK_ID.findall(DOC.read_text()))
    elsewhere = {found for path in (ROOT / "sqlqueue").rglob("*.py")
                 if any(part in str(path) for part in ELSEWHERE)
                 for found in CHECK_ID.findall(path.read_text())}
    assert sorted(documented - elsewhere - set(made_by())) == []
    assert sorted(set(made_by()) - documented) == []


def test_checks_are_registered_in_one_place() -> None:
    registering = sorted(path.name for path in CHECKS.glob("*.py")
                         if "register(" in path.read_text())
    assert registering == ["__init__.py"]


def test_the_scan_sees_the_checks() -> None:
    found = made_by()
    assert found["sqlqueue.W104"] == {"sqlite:not_immediate"}
    assert found["sqlqueue.E102"] == {"versions:too_old"}
