"""The architecture the package's folders promise, pinned: lower layers never import
higher ones (imports read from the source, no Django needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue"

#: layer -> the sqlqueue modules and packages it must never import
FORBIDDEN = {
    "sqlqueue.storage": ("sqlqueue.models", "sqlqueue.publishing", "sqlqueue.consuming",
                         "sqlqueue.scheduling", "sqlqueue.operations", "sqlqueue.admin",
                         "sqlqueue.management", "sqlqueue.integrations"),
    "sqlqueue.models": ("sqlqueue.publishing", "sqlqueue.consuming", "sqlqueue.scheduling",
                        "sqlqueue.operations", "sqlqueue.admin", "sqlqueue.management"),
    "sqlqueue.publishing": ("sqlqueue.consuming", "sqlqueue.scheduling", "sqlqueue.operations",
                            "sqlqueue.admin", "sqlqueue.management", "sqlqueue.integrations"),
    "sqlqueue.consuming": ("sqlqueue.scheduling", "sqlqueue.operations", "sqlqueue.admin",
                           "sqlqueue.management", "sqlqueue.integrations"),
    "sqlqueue.scheduling": ("sqlqueue.operations", "sqlqueue.admin", "sqlqueue.management",
                            "sqlqueue.consuming"),
    "sqlqueue.operations": ("sqlqueue.admin", "sqlqueue.management"),
    # Commands act through sqlqueue.operations (runconsumer runs the engine itself).
    "sqlqueue.management": ("sqlqueue.models", "sqlqueue.storage"),
    # The testing toolkit sits on top of the engine and the models: only tests import it
    # (test_nothing_of_the_package_imports_the_testing_toolkit).
    "sqlqueue.testing": ("sqlqueue.admin", "sqlqueue.management", "sqlqueue.operations",
                         "sqlqueue.scheduling"),
    # Wake-ups sit below both sides: the publisher rings, the runner listens.
    "sqlqueue.wakeups": ("sqlqueue.models", "sqlqueue.publishing", "sqlqueue.consuming",
                         "sqlqueue.scheduling", "sqlqueue.operations", "sqlqueue.admin",
                         "sqlqueue.management", "sqlqueue.integrations"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("sqlqueue")}


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if not inside(module, layer):
            continue
        for imported in sorted(imports(path)):
            if any(inside(imported, above) for above in FORBIDDEN[layer]):
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_check_sees_an_import() -> None:
    # The scanner itself: a real import of the runner is found where it is.
    assert "sqlqueue.consuming.runner" in imports(
        PACKAGE / "management" / "commands" / "runconsumer.py")


def test_nothing_of_the_package_imports_the_testing_toolkit() -> None:
    # sqlqueue.testing is for users' tests; runconsumer only names it in its refusal.
    wrong = [f"{module_name(path)} imports {imported}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if not inside(module_name(path), "sqlqueue.testing")
             for imported in sorted(imports(path)) if inside(imported, "sqlqueue.testing")]
    assert wrong == []
