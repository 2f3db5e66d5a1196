"""Time is injected into the consumer engine, not read from the process (issue 54): no
module of sqlqueue/consuming reads the ``time`` module, nor the wall clock through
``datetime``/``django.utils.timezone``, except ``consuming/clock.py``, which defines the
clocks the engine is given (``HostClock``: monotonic, wall, sleep; ``Clock``: the
database's). A test or the stepped engine passes a manual clock instead of patching a
module's ``time`` (that patch was process-wide: every thread saw it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "sqlqueue" / "consuming"
#: the one module that reads the process's clocks
CLOCK_MODULE = "clock.py"
#: wall-clock readings through other modules: (module or class name, attribute)
WALL_CLOCKS = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
               ("timezone", "now"), ("date", "today")}


def direct_time(source: str) -> list[str]:
    """Where ``source`` reads time itself: an import of ``time`` (or of names from it),
    or a wall-clock call through ``datetime``/``timezone``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "time" for a in node.names):
            found.append(f"line {node.lineno}: import time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found.append(f"line {node.lineno}: from time import ...")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and (node.value.id, node.attr) in WALL_CLOCKS):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_consuming_module_reads_time_directly() -> None:
    readers = {path.name: where for path in sorted(ENGINE.glob("*.py"))
               if path.name != CLOCK_MODULE
               and (where := direct_time(path.read_text()))}
    assert readers == {}, "pass the engine's clock (consuming/clock.py) instead"


def test_the_scan_sees_each_way_of_reading_time() -> None:
    assert direct_time("import time\ntime.monotonic()\n") == ["line 1: import time"]
    assert direct_time("from time import monotonic\n") == ["line 1: from time import ..."]
    assert direct_time("import os, time\n") == ["line 1: import time"]
    assert direct_time("from datetime import datetime\ndatetime.now()\n") == [
        "line 2: datetime.now"]
    assert direct_time("from django.utils import timezone\ntimezone.now()\n") == [
        "line 2: timezone.now"]
    assert direct_time("def f(clock):\n    return clock.monotonic()\n") == []


def test_the_clock_module_is_the_one_that_reads_time() -> None:
    assert direct_time((ENGINE / CLOCK_MODULE).read_text()) != []
