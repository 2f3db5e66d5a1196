"""docs/guides/testing.md shows only code the suite runs (issue 38): every Python block of
the guide is an excerpt, verbatim, of the example project's tests, which
tests/acceptance/test_example_tests.py runs. Edit the tests, then copy them to the guide."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "testing.md"
SOURCES = [ROOT / "example_project" / "shop" / "tests.py",
           ROOT / "example_project" / "shop" / "pytest_examples.py"]


def python_blocks(markdown: str) -> list[str]:
    return [textwrap.dedent(block).strip("\n")
            for block in re.findall(r"^```python\n(.*?)^```", markdown, re.S | re.M)]


def quoted_from(block: str, source: str) -> bool:
    """``block`` is a run of ``source``'s lines, at some indentation."""
    return any(textwrap.indent(block, " " * depth) + "\n" in source for depth in (0, 4, 8))


def test_every_python_block_of_the_guide_is_run_by_the_suite() -> None:
    sources = "\n".join(path.read_text() for path in SOURCES)
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) >= 6
    assert [b.splitlines()[0] for b in blocks if not quoted_from(b, sources)] == []


def test_the_check_catches_a_drifted_block() -> None:
    source = "class A:\n    def f(self) -> None:\n        run_consumers()\n"
    assert quoted_from("def f(self) -> None:\n    run_consumers()", source)
    assert not quoted_from("def f(self) -> None:\n    run_consumers(group='x')", source)
