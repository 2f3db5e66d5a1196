"""One exception root: every exception class sqlqueue defines derives from
SqlqueueError (docs/reference/api.md, "Exceptions"), found by reading the source."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

from sqlqueue.exceptions import SqlqueueError

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue"
#: modules that need an optional extra (PySpark, pyarrow) to import
OPTIONAL = ("sqlqueue.integrations.spark.",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every top-level public class whose name says it is an error,
    or whose bases name an exception."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            if any(b.endswith(("Error", "Exception", "Warning")) for b in bases) or (
                    node.name.endswith(("Error", "Exception"))):
                found.append((module_name(path), node.name))
    return found


def test_every_exception_derives_from_the_root() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure()
        django.setup()
    outside = []
    for module, name in exception_classes():
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            assert module.startswith(OPTIONAL), module
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException) and not issubclass(
                cls, SqlqueueError):
            outside.append(f"{module}.{name}")
    assert outside == []


def test_the_scan_finds_errors_with_other_roots() -> None:
    assert ("sqlqueue.scheduling.definitions", "ScheduleError") in exception_classes()
    assert ("sqlqueue.storage.sql.postgresql", "DuplicateMessage") in exception_classes()


def test_the_root_imports_no_django() -> None:
    code = ("import sys, sqlqueue.exceptions, sqlqueue.integrations.spark.errors; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"
