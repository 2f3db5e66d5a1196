"""The architecture the package's folders promise, pinned: lower layers never import
higher ones (imports read from the source, no Django needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue"

ADMIN, MANAGEMENT, OPERATIONS = "sqlqueue.admin", "sqlqueue.management", "sqlqueue.operations"
INTEGRATIONS, TASKS, SPARK = ("sqlqueue.integrations", "sqlqueue.integrations.tasks",
                              "sqlqueue.integrations.spark")
#: the web and operator faces: nothing below them imports these
FACES = (ADMIN, MANAGEMENT, "sqlqueue.metrics", "sqlqueue.views", "sqlqueue.checks",
         "sqlqueue.apps", "sqlqueue.templatetags", "sqlqueue.urls")

#: layer -> the sqlqueue modules and packages it must never import
FORBIDDEN = {
    "sqlqueue.storage": ("sqlqueue.models", "sqlqueue.publishing", "sqlqueue.consuming",
                         "sqlqueue.scheduling", OPERATIONS, INTEGRATIONS, *FACES),
    "sqlqueue.models": ("sqlqueue.publishing", "sqlqueue.consuming", "sqlqueue.scheduling",
                        OPERATIONS, INTEGRATIONS, *FACES),
    # A stored schedule's row of ticks goes with it (signals connected by sqlqueue.apps).
    "sqlqueue.stored_schedule_rows": ("sqlqueue.publishing", "sqlqueue.consuming",
                                      "sqlqueue.scheduling", OPERATIONS, INTEGRATIONS,
                                      *FACES),
    "sqlqueue.publishing": ("sqlqueue.consuming", "sqlqueue.scheduling", OPERATIONS,
                            INTEGRATIONS, *FACES),
    "sqlqueue.consuming": ("sqlqueue.publishing", "sqlqueue.scheduling", OPERATIONS,
                           INTEGRATIONS, *FACES),
    # A schedule naming a task reaches the Tasks backend through scheduling.targets.
    "sqlqueue.scheduling": ("sqlqueue.consuming", OPERATIONS, INTEGRATIONS, *FACES),
    "sqlqueue.operations": (INTEGRATIONS, *FACES),
    # Commands act through sqlqueue.operations (runconsumer runs the engine itself).
    MANAGEMENT: ("sqlqueue.models", "sqlqueue.storage", ADMIN, "sqlqueue.views"),
    # The admin acts through sqlqueue.operations and reads the models.
    ADMIN: ("sqlqueue.storage", "sqlqueue.publishing", "sqlqueue.consuming",
            "sqlqueue.scheduling", INTEGRATIONS, MANAGEMENT, "sqlqueue.metrics",
            "sqlqueue.views", "sqlqueue.checks", "sqlqueue.apps"),
    # The Tasks backend is a consumer and a publisher; its results page is an admin page,
    # whose retry and discard act through sqlqueue.operations (the dead letters' verbs).
    TASKS: (SPARK, MANAGEMENT, "sqlqueue.metrics", "sqlqueue.views", "sqlqueue.checks",
            "sqlqueue.apps"),
    # Spark's executors import no Django; its driver side reads positions and pauses.
    SPARK: ("sqlqueue.publishing", "sqlqueue.scheduling", TASKS, *FACES),
    "sqlqueue.metrics": ("sqlqueue.storage", "sqlqueue.models", "sqlqueue.publishing",
                         "sqlqueue.scheduling", INTEGRATIONS, ADMIN, MANAGEMENT,
                         "sqlqueue.views", "sqlqueue.checks", "sqlqueue.apps"),
    "sqlqueue.views": ("sqlqueue.storage", "sqlqueue.models", "sqlqueue.publishing",
                       "sqlqueue.consuming", "sqlqueue.scheduling", OPERATIONS, INTEGRATIONS,
                       ADMIN, MANAGEMENT, "sqlqueue.checks", "sqlqueue.apps"),
    "sqlqueue.checks": ("sqlqueue.publishing", "sqlqueue.consuming", OPERATIONS, SPARK,
                        ADMIN, MANAGEMENT, "sqlqueue.metrics", "sqlqueue.views",
                        "sqlqueue.apps"),
    "sqlqueue.apps": ("sqlqueue.storage", "sqlqueue.publishing", "sqlqueue.scheduling",
                      OPERATIONS, SPARK, MANAGEMENT, "sqlqueue.metrics", "sqlqueue.views"),
    # The testing toolkit sits on top of the engine and the models: only tests import it
    # (test_nothing_of_the_package_imports_the_testing_toolkit).
    "sqlqueue.testing": (ADMIN, MANAGEMENT, OPERATIONS, "sqlqueue.scheduling"),
    # A migration is frozen: it must not change when live code does (only the models'
    # definitions, which Django freezes itself, are imported).
    "sqlqueue.migrations": ("sqlqueue.storage", "sqlqueue.publishing", "sqlqueue.consuming",
                            "sqlqueue.scheduling", "sqlqueue.wakeups", "sqlqueue.conf",
                            OPERATIONS, INTEGRATIONS, *FACES),
    # Wake-ups sit below both sides: the publisher rings, the runner listens.
    "sqlqueue.wakeups": ("sqlqueue.models", "sqlqueue.publishing", "sqlqueue.consuming",
                         "sqlqueue.scheduling", OPERATIONS, INTEGRATIONS, *FACES),
}

#: (importer, imported) -> why the one exception to FORBIDDEN is there
ALLOWED = {
    ("sqlqueue.models", "sqlqueue.integrations.tasks.models"):
        "Django's app registry: the Tasks backend's results model is one of sqlqueue's "
        "models, so sqlqueue's models module must import it",
}

#: what needs no entry: leaves every layer may import (they import no other part), the
#: public re-exports of an integration
UNLAYERED = {"sqlqueue", "sqlqueue.conf", "sqlqueue.naming", "sqlqueue.exceptions",
             "sqlqueue.database_names", "sqlqueue.clocks",
             "sqlqueue.horizon", "sqlqueue.literals", "sqlqueue.events",
             "sqlqueue.setting_converters", "sqlqueue.tracing", "sqlqueue.tasks",
             "sqlqueue.spark", "sqlqueue.templatetags", "sqlqueue.urls",
             INTEGRATIONS}


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
            if (any(inside(imported, above) for above in FORBIDDEN[layer])
                    and (module, imported) not in ALLOWED):
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_every_part_of_the_package_has_an_entry() -> None:
    parts = {module_name(path) for path in PACKAGE.glob("*.py")} | {
        module_name(path.parent) for path in PACKAGE.glob("*/__init__.py")} | {
        module_name(path.parent) for path in (PACKAGE / "integrations").glob("*/__init__.py")}
    assert sorted(parts - set(FORBIDDEN) - UNLAYERED) == []


def test_the_allowed_exceptions_are_still_needed() -> None:
    for module, imported in ALLOWED:
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        if not path.exists():  # a package
            path = path.with_suffix("") / "__init__.py"
        assert imported in imports(path), f"{module} no longer imports {imported}"


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
