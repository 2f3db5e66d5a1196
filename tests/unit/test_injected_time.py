"""Time is injected, not read from the process (issue 54): no module of the engine
(sqlqueue/consuming), the wake-ups, the publishing path, scheduling or the operations reads
the ``time`` module, nor the wall clock through ``datetime``/``django.utils.timezone``.
They are given the clocks of ``sqlqueue/clocks.py`` (``HostClock``: monotonic, wall,
sleep; the default ``SYSTEM_CLOCK`` is the one place that reads ``time``) and the
database's (``consuming/clock.py``). A test or the stepped engine passes a manual clock
instead of patching a module's ``time`` (that patch was process-wide: every thread saw
it).

What stays on the process's clocks, outside these packages, and why:

* ``sqlqueue.wakeups.Doorbell`` (``wakeups/__init__.py``, listed in ``SYSTEM_TIME``): its
  wait is a real ``threading.Condition`` wait, whose timeout is the process's monotonic
  clock; a manual clock could not end it (the stepped engine never waits on it:
  ``run_once``).
* ``storage/retry.py``: the pause between tries of a statement (``sleep=`` is injectable);
  ``sqlqueue.horizon``: its default monotonic clock (``monotonic=`` is injectable).
* ``management/``: the command line's own pacing (runconsumer's restart backoff) and the
  rate it reports (``queue`` repairs); ``metrics.py``: a scrape's duration; ``admin/``:
  display ("3 minutes ago").
* ``integrations/``: Django's Tasks results are stamped with ``timezone.now()`` (the
  Tasks API's contract, stepped by ``sqlqueue.testing``'s clock); Spark's report, batch
  names and time windows are the driver's wall clock.
* ``testing/``: the toolkit's clock is what it steps (``timezone.now``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sqlqueue"
ENGINE = PACKAGE / "consuming"
#: the packages given their clocks
INJECTED = ("consuming", "wakeups", "publishing", "scheduling", "operations")
#: the one module that reads the process's clocks for them
CLOCK_MODULE = PACKAGE / "clocks.py"
#: module (relative to sqlqueue/) -> why it reads the process's clock itself
SYSTEM_TIME = {
    "wakeups/__init__.py": "the Doorbell's wait is a real Condition wait (the process's "
                           "monotonic clock times it); a manual clock could not end it",
}
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


def readers() -> dict[str, list[str]]:
    """Module (relative to sqlqueue/) -> where it reads time, in the INJECTED packages."""
    return {str(path.relative_to(PACKAGE)): where for package in INJECTED
            for path in sorted((PACKAGE / package).rglob("*.py"))
            if (where := direct_time(path.read_text()))}


def test_no_consuming_module_reads_time_directly() -> None:
    engine = {module: where for module, where in readers().items()
              if module.startswith("consuming/")}
    assert engine == {}, "pass the engine's clock (consuming/clock.py) instead"


def test_no_module_given_a_clock_reads_time_directly() -> None:
    found = {module: where for module, where in readers().items()
             if module not in SYSTEM_TIME}
    assert found == {}, "take a host_clock (sqlqueue/clocks.py) instead"


def test_the_modules_on_the_system_clock_still_read_it() -> None:
    assert sorted(SYSTEM_TIME) == sorted(module for module in readers()
                                         if module in SYSTEM_TIME)


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
    assert direct_time(CLOCK_MODULE.read_text()) != []


def test_the_health_check_reads_the_clock_it_is_given(tmp_path: Path) -> None:
    """``runner_alive`` (the liveness file's age) on a clock a test moves."""
    import os

    from sqlqueue.operations.health import runner_alive
    from tests.manual_clock import ManualSeconds

    path = tmp_path / "alive"
    path.touch()
    os.utime(path, (1_000.0, 1_000.0))
    assert runner_alive(str(path), 30, ManualSeconds(1_020.0)).healthy
    report = runner_alive(str(path), 30, ManualSeconds(1_040.0))
    assert not report.healthy and "40.0s ago" in report.reasons[0]
