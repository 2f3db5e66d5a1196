"""One ack writer and one give-back path: only sqlqueue.consuming.outcomes calls
``Store.write_outcomes`` and ``Store.give_back`` (calls read from the source, no
Django needed). Everything else acks through ``outcomes.write_acks`` (or ``ack``) and
gives back through ``outcomes.give_back``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sqlqueue"
WRITER = PACKAGE / "consuming" / "outcomes.py"
#: where the statements themselves are defined (and may call one another)
STATEMENTS = PACKAGE / "storage"


def calls(path: Path, method: str) -> list[int]:
    """Lines of ``<anything>.method(...)`` calls with arguments: a store's statement
    takes a cursor first (``Delivery.give_back()``, the in-memory claim, takes none).
    ``outcomes.give_back(...)``, the writer's own function, is not one of them."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method and (node.args or node.keywords)
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "outcomes")]


def callers(method: str) -> dict[str, list[int]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == WRITER or path.is_relative_to(STATEMENTS):
            continue
        lines = calls(path, method)
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    return found


def test_only_the_writer_writes_outcomes() -> None:
    assert callers("write_outcomes") == {}, "ack through sqlqueue.consuming.outcomes"


def test_only_the_writer_gives_back() -> None:
    assert callers("give_back") == {}, "give back through sqlqueue.consuming.outcomes"


def test_the_scan_sees_the_writer() -> None:
    assert calls(WRITER, "write_outcomes") and calls(WRITER, "give_back")


def test_the_writer_is_used_by_every_acking_layer() -> None:
    # The atomic handler, the outcome recorder, an operator's cancel and the Tasks worker.
    for module in ("consuming/handlers.py", "consuming/recorder.py",
                   "operations/cancel.py", "integrations/tasks/worker.py"):
        source = (PACKAGE / module).read_text()
        assert "from sqlqueue.consuming.outcomes import" in source, module
