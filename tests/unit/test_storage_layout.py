"""The store's layout and name (issue 54), read from the source without Django:

- each subject's executor module runs only the builders of the statement module of its
  name (``storage/sql/<x>.py`` runs ``storage/statements/<x>.py``): a statement crosses
  two storage files with matching names. The vendor modules (``mysql``, ``postgresql``,
  ``sqlite``) override the subjects' methods their own way and are left out, as are
  ``base`` (the ``Store`` that composes the subjects), ``tables`` (rows and hooks) and
  ``prepared``;
- what ``sqlqueue.storage.store(using)`` returns is called a store, not a dialect, and
  the accessor is called qualified (``storage.store(using)``), so that the locals named
  ``store`` shadow nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sqlqueue" / "storage" / "sql"
STATEMENTS = ROOT / "sqlqueue" / "storage" / "statements"
#: executor modules that are not one subject's
NOT_A_SUBJECT = {"__init__", "base", "tables", "prepared", "mysql", "postgresql", "sqlite"}
#: statement modules of vendors' overrides: a builder defined in one of them and in a
#: subject module is that subject's
VENDOR_BUILDERS = {"postgresql"}


def _methods(path: Path) -> dict[str, ast.FunctionDef]:
    return {node.name: node for cls in ast.parse(path.read_text()).body
            if isinstance(cls, ast.ClassDef) for node in cls.body
            if isinstance(node, ast.FunctionDef)}


def builder_homes() -> dict[str, str]:
    """builder name -> the statement module that defines it for every vendor."""
    found: dict[str, set[str]] = {}
    for path in STATEMENTS.glob("*.py"):
        for name in _methods(path):
            found.setdefault(name, set()).add(path.stem)
    return {name: min(modules - VENDOR_BUILDERS or modules) for name, modules in found.items()}


def builders_run(path: Path) -> dict[str, set[str]]:
    """executor method -> the ``self.sql.<builder>`` names it runs."""
    return {name: {node.attr for node in ast.walk(method)
                   if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                   and node.value.attr == "sql"}
            for name, method in _methods(path).items()}


def test_every_subject_executor_runs_its_own_statement_module() -> None:
    homes = builder_homes()
    crossing = {}
    subjects = sorted(p for p in SQL.glob("*.py") if p.stem not in NOT_A_SUBJECT)
    assert {p.stem for p in subjects} >= {"delivery", "watermarks", "membership", "failover"}
    for path in subjects:
        assert (STATEMENTS / path.name).exists(), f"sql/{path.name} has no statements/{path.name}"
        for method, builders in builders_run(path).items():
            others = {b: homes[b] for b in builders if homes[b] != path.stem}
            if others:
                crossing[f"sql/{path.name}: {method}"] = others
    assert crossing == {}


def test_the_check_finds_a_crossing() -> None:
    # sql/delivery.py ran statements/watermarks.py's builders before issue 54
    homes = builder_homes()
    assert homes["ensure_watermarks"] == "watermarks" and homes["fetch_partitions"] == "delivery"
    assert homes["offset_counter"] == "vendors"  # PostgreSQL's override is not its home


def test_what_store_returns_is_a_store() -> None:
    bare_import = re.compile(r"^\s*from sqlqueue\.storage import (.*\b)?store\b", re.MULTILINE)
    dialect = re.compile(r"(?<![A-Za-z])[Dd]ialects?(?![a-z])")
    found = {}
    for top in ("sqlqueue", "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "test_docs_site.py" or path == Path(__file__):
                continue  # Markdown's dialect; this file's patterns
            text = path.read_text("utf-8")
            problems = [what for what, pattern in (("from sqlqueue.storage import store",
                                                    bare_import), ("dialect", dialect))
                        if pattern.search(text)]
            if problems:
                found[str(path.relative_to(ROOT))] = problems
    assert found == {}
