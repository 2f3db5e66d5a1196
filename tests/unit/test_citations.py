"""What the code cites is in the repository (issue 54): no comment or docstring points at
a SPEC the repository does not have (guarantees are cited as ``I1``-``I16``, the rows of
docs/reference/guarantees.md), every docs page it names exists, and a section it names
in quotes (``docs/guides/operations.md, "Pause and resume"``) is a heading of that page.
Read from the source (no Django)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sqlqueue"
SPEC = re.compile(r"(?<![\w.])SPEC(?![\w.])")
PAGE = re.compile(r"docs/[\w/-]+\.md")
SECTION = re.compile(r"(docs/[\w/-]+\.md),\s+\"([^\"]+)\"")
#: a line break inside a comment or docstring, with what starts the next line
LINE_BREAK = re.compile(r"\n\s*(?:#:?\s*)?")


def sources() -> dict[str, str]:
    """Module (relative path) -> its text, line breaks of comments joined."""
    return {str(path.relative_to(ROOT)): LINE_BREAK.sub(" ", path.read_text())
            for path in sorted(PACKAGE.rglob("*.py"))}


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip().replace("`", "")
            for line in page.read_text().splitlines() if line.startswith("#")}


def test_no_code_cites_a_spec_outside_the_repository() -> None:
    citing = sorted(module for module, text in sources().items() if SPEC.search(text))
    assert citing == []


def test_every_cited_docs_page_exists() -> None:
    missing = sorted({f"{module}: {page}" for module, text in sources().items()
                      for page in PAGE.findall(text) if not (ROOT / page).is_file()})
    assert missing == []


def test_every_cited_section_is_a_heading_of_its_page() -> None:
    wrong = sorted({f"{module}: {page}, {section!r}"
                    for module, text in sources().items()
                    for page, section in SECTION.findall(text)
                    if (ROOT / page).is_file() and section not in headings(ROOT / page)})
    assert wrong == []


def test_the_scans_see_citations() -> None:
    text = LINE_BREAK.sub(" ", '"""Pauses (docs/guides/operations.md, "Pause and\n'
                               '    resume"); SPEC §9."""\n#: not SPEC_VERSION nor a.SPEC')
    assert SECTION.findall(text) == [("docs/guides/operations.md", "Pause and resume")]
    assert len(SPEC.findall(text)) == 1
    assert "Pause and resume" in headings(ROOT / "docs/guides/operations.md")
    assert any(SECTION.findall(text) for text in sources().values())
