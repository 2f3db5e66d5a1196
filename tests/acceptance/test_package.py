"""The release artefacts (issue 13): the wheel and the sdist carry everything the app
needs at run time, under the distribution name django-sqlqueue, with complete metadata
that the package index accepts (twine check)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.database_independent, pytest.mark.checkout]  # Makefile


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                           check=True, capture_output=True, text=True)
    (out.parent / f"{out.name}-build.log").write_text(built.stdout + built.stderr)
    return out


def test_the_build_prints_no_setuptools_warning(dist: Path) -> None:
    """Issue 37: the template folders were data setuptools warned about at each build
    ("Package would be ignored"); they are namespace packages of data now."""
    log = (dist.parent / f"{dist.name}-build.log").read_text()
    assert "would be ignored" not in log and "WARNING" not in log, log


def runtime_files() -> list[str]:
    """Every file of the package that is not Python: templates, static files, markers."""
    package = ROOT / "sqlqueue"
    return sorted(str(p.relative_to(ROOT)) for p in package.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")
                  and "__pycache__" not in p.parts)


def test_the_wheel_carries_every_runtime_file(dist: Path) -> None:
    (wheel,) = dist.glob("django_sqlqueue-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = runtime_files()
    assert "sqlqueue/py.typed" in wanted
    assert any(name.startswith("sqlqueue/templates/") for name in wanted)
    assert [f for f in wanted if f not in names] == []
    migrations = {p.name for p in (ROOT / "sqlqueue" / "migrations").glob("0*.py")}
    assert {n.rsplit("/", 1)[-1] for n in names if "/migrations/0" in n} == migrations
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_sdist_carries_every_runtime_file_and_the_license(dist: Path) -> None:
    (sdist,) = dist.glob("django_sqlqueue-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert [f for f in runtime_files() if f not in names] == []
    assert {"LICENSE", "README.md", "CHANGELOG.md"} <= names


def test_metadata_names_the_distribution_and_its_license(dist: Path) -> None:
    (wheel,) = dist.glob("django_sqlqueue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(path).decode())
    assert metadata["Name"] == "django-sqlqueue"
    assert metadata["License-Expression"] == "MIT"
    assert "Framework :: Django :: 6.1" in metadata.get_all("Classifier")
    assert metadata.get_all("Project-URL")
    # Links in the long description work on the package index: no relative ones.
    description = metadata.get_payload()
    assert "](docs/" not in description and "](CHANGELOG" not in description


def test_the_wheel_declares_the_pytest_plugin(dist: Path) -> None:
    (wheel,) = dist.glob("django_sqlqueue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(path).decode()
    assert "[pytest11]\nsqlqueue = sqlqueue.testing.pytest_plugin" in declared


def test_twine_accepts_both(dist: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                             *map(str, sorted(dist.iterdir()))], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
