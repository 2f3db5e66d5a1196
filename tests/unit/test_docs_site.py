"""The docs site and the long description (issue 13): mkdocs.yml's nav covers every page
under docs/, the strict MkDocs build passes (a dead link, a missing anchor or a page left
out of the nav fails it), and README.md, the long description on the package index, has
only absolute links, to files and pages that exist.

The MkDocs tests need the `docs` extra. Without it they skip, unless
SQLQUEUE_REQUIRE_DOCS=1 (`make test`), where they fail instead: CI cannot skip them."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REPOSITORY = "https://github.com/django-sqlqueue/django-sqlqueue"
SITE = "https://django-sqlqueue.readthedocs.io/en/latest/"


def require_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is not None and (
            importlib.util.find_spec("material") is not None):
        return
    if os.environ.get("SQLQUEUE_REQUIRE_DOCS") == "1":
        pytest.fail("SQLQUEUE_REQUIRE_DOCS=1 but mkdocs or mkdocs-material is not installed "
                    "(pip install -e '.[docs]')")
    pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")


def nav_pages(nav: Any) -> list[str]:
    """Every page path in a MkDocs nav, in order (nested sections included)."""
    if isinstance(nav, str):
        return [] if "://" in nav else [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {nav!r}")


def markdown_pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def without_code(text: str) -> str:
    """Markdown without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def link_targets(text: str) -> list[str]:
    """The targets of inline links and images, reference definitions and HTML href/src."""
    text = without_code(text)
    return (re.findall(r"\]\(\s*<?([^)\s>]+)", text)
            + re.findall(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?\s*$", text, flags=re.M)
            + re.findall(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", text))


def test_the_nav_lists_every_page_once_and_only_pages_that_exist() -> None:
    require_mkdocs()
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    assert config["theme"]["name"] == "material"
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice"
    pages = markdown_pages()
    assert [p for p in pages if p not in listed] == [], "pages missing from mkdocs.yml's nav"
    assert [p for p in listed if p not in pages] == [], "nav entries without a page"


def test_the_strict_build_passes(tmp_path: Path) -> None:
    require_mkdocs()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    for page in markdown_pages():
        if page != "README.md":
            assert (site / page.removesuffix(".md") / "index.html").is_file(), page
    # Files the pages link to besides pages (the Grafana dashboard, results, images).
    assert (site / "guides" / "grafana-sqlqueue.json").is_file()
    assert (site / "results").is_dir() and list((site / "results").glob("*.json"))


def dialect_problems(text: str) -> list[str]:
    """Markdown that GitHub renders one way and the site (Python-Markdown) another: inside
    a list, a nested item or a block after a blank line indented by 1-3 spaces (Python-
    Markdown wants 4, or it leaves the list), and an item right after an item that holds a
    blank line (it runs into that item's last paragraph)."""
    problems = []
    fence = in_list = loose = blank = False
    previous = ""
    for number, line in enumerate(text.splitlines(), 1):
        is_fence = re.match(r"\s*(```|~~~)", line) is not None
        if fence:
            fence = not is_fence
            previous = line
            continue
        indent = len(line) - len(line.lstrip(" "))
        item = re.match(r" *([-*+]|\d+[.)]) ", line) is not None
        if not line.strip():
            blank, loose = True, loose or in_list
            previous = line
            continue
        if indent == 0:
            if item and in_list and loose and previous.strip():
                problems.append(f"{number}: a blank line before this item: {line[:50]!r}")
            if item:
                loose = False
            in_list = item or (in_list and not blank and not line.startswith("#"))
        elif in_list and 0 < indent < 4 and (blank or item):
            problems.append(f"{number}: indent by 4 inside a list: {line[:50]!r}")
        fence, blank, previous = is_fence, False, line
    return problems


@pytest.mark.parametrize("page", markdown_pages())
def test_pages_render_on_the_site_as_on_github(page: str) -> None:
    assert dialect_problems((DOCS / page).read_text("utf-8")) == []


def test_the_dialect_check_finds_what_the_site_would_misrender() -> None:
    assert dialect_problems("- a\n  - b\n") != []
    assert dialect_problems("- a\n\n  ```sh\n  x\n  ```\n") != []
    assert dialect_problems("- a\n\n    more\n- b\n") != []
    assert dialect_problems("- a\n    - b\n\n    ```sh\n    x\n    ```\n\n- c\n") == []
    assert dialect_problems("- a\n  lazy\n- b\n\ntext\n  not a list\n") == []


def test_the_docs_home_links_every_page() -> None:
    """docs/README.md is the site's home page and the folder's index on GitHub."""
    targets = {t.split("#")[0] for t in link_targets((DOCS / "README.md").read_text("utf-8"))}
    assert [p for p in markdown_pages() if p != "README.md" and p not in targets] == []


def test_readme_links_are_absolute() -> None:
    """README.md is the long description on the package index, where a relative link is
    dead: every link is http(s) or an anchor within the page."""
    targets = link_targets((ROOT / "README.md").read_text("utf-8"))
    assert targets, "no links found: the link pattern is broken"
    relative = [t for t in targets if not re.match(r"https?://|#", t)]
    assert relative == []


def test_readme_points_to_the_docs_site() -> None:
    targets = link_targets((ROOT / "README.md").read_text("utf-8"))
    assert SITE in targets
    assert any(t.startswith(SITE) and t != SITE for t in targets)


@pytest.mark.parametrize("source", ["README.md", "CHANGELOG.md", "SECURITY.md",
                                    *(f"docs/{p}" for p in markdown_pages())])
def test_absolute_links_into_the_project_name_what_exists(source: str) -> None:
    """A link to the project's GitHub files or to its docs site names a file in this
    checkout or a page of the site: the strict build cannot see these."""
    missing = []
    for target in link_targets((ROOT / source).read_text("utf-8")):
        target = target.split("#")[0]
        if target.startswith(f"{REPOSITORY}/blob/main/") or (
                target.startswith(f"{REPOSITORY}/tree/main/")):
            path = ROOT / target.split("/main/", 1)[1]
            if not path.exists():
                missing.append(target)
        elif target.startswith(SITE):
            page = target.removeprefix(SITE).strip("/")
            if page and not (DOCS / f"{page}.md").is_file():
                missing.append(target)
    assert missing == []
