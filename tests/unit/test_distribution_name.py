"""Every install hint names the distribution, ``django-sqlqueue`` (issue 37): ``pip
install 'sqlqueue[...]'`` installs nothing of ours ("sqlqueue" on the package index is an
unrelated project)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "sqlqueue[" not part of "django-sqlqueue[" nor of the settings dict, SQLQUEUE["..."].
BARE_EXTRA = re.compile(r"(?<![-\w.])sqlqueue\[")
SEARCHED = ("sqlqueue", "docs", "example_project", "pyspark_sqlqueue")


def shipped_text() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "setup.cfg", ROOT / "pyproject.toml"]
    for folder in SEARCHED:
        for suffix in ("*.py", "*.md", "*.html", "*.txt"):
            files.extend((ROOT / folder).rglob(suffix))
    return files


def test_no_message_or_doc_names_an_extra_of_sqlqueue() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in shipped_text()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if BARE_EXTRA.search(line)]
    assert not wrong, "\n".join(wrong)
