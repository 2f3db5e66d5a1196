"""Every attribute of the consumer engine's objects has one owner (issue 40): each is in
the table "Who owns what" of docs/internals.md, and none is written from outside its
class's module, except the writes listed in ``OUTSIDE_WRITES`` with their reason (the
table names them too). Read from the source with ``ast`` (no Django needed).

An attribute is one its class assigns (``self.x = ...``, ``self.x += ...``,
``self.x[k] = ...``) in its own methods, or a dataclass field. A write from outside is
``<something>.x = ...`` (also augmented, subscripted, or a mutating call such as
``<something>.x.append(...)``) in a module of the package other than the class's, where
``x`` is an attribute of that class, or ``self.x = ...`` in a subclass defined elsewhere.
Objects are not typed here: a write in a module that owns another attribute of the same
name is not seen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sqlqueue"
ENGINE = PACKAGE / "consuming"
DOC = ROOT / "docs" / "internals.md"
SECTION = "## Who owns what"

#: The Runner, the Subscriber and their parts, by module of sqlqueue/consuming.
CLASSES: dict[str, tuple[str, ...]] = {
    "runner.py": ("Runner",),
    "subscriber.py": ("Subscriber",),
    "handoff.py": ("HandlerPool",),
    "pacing.py": ("Pacer",),
    "server.py": ("ServerWatch",),
    "settling.py": ("HorizonWatch",),
    "exiting.py": ("ExitSettler",),
    "pauses.py": ("PauseWatch",),
    "gc.py": ("GarbageCollector",),
    "discovery.py": ("PartitionFinder",),
    "leases.py": ("LeaseKeeper",),
    "delivering.py": ("Fetcher", "HeldView"),
    "watermarks.py": ("WatermarkKeeper",),
    "ledger.py": ("Deliveries",),
    "recorder.py": ("OutcomeRecorder",),
    "signals.py": ("StopOnSignals",),
    "transactions.py": ("FencedTransactions",),
    "partition.py": ("PartitionState", "Entry", "Hold"),
}
#: How the code names the engine's objects: a write to ``<name>.x`` is to that class's.
RECEIVERS = {"runner": "Runner", "subscriber": "Subscriber", "pool": "HandlerPool",
             "pacer": "Pacer", "server": "ServerWatch", "horizon": "HorizonWatch",
             "exit": "ExitSettler", "pauses": "PauseWatch", "collector": "GarbageCollector",
             "finder": "PartitionFinder", "leases": "LeaseKeeper", "fetcher": "Fetcher",
             "view": "HeldView", "watermarks": "WatermarkKeeper", "state": "PartitionState",
             "entry": "Entry", "hold": "Hold", "deliveries": "Deliveries",
             "recorder": "OutcomeRecorder", "on_signals": "StopOnSignals",
             "transactions": "FencedTransactions"}
#: The modules (relative to sqlqueue/) that handle engine objects under other names too.
ENGINE_USERS = ("consuming/", "testing/", "management/")
MUTATING = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "add",
            "discard", "update", "setdefault", "__setitem__", "__delitem__"}

#: Writes from outside the owner's module that are known, as "Class.attribute" ->
#: {where: why}. Each is listed in the doc's table too. Leaving one here fails
#: test_the_known_outside_writes_are_current once it is gone.
OUTSIDE_WRITES: dict[str, dict[str, str]] = {}


def _self_targets(node: ast.AST) -> set[str]:
    """Attributes of ``self`` that an assignment or augmented assignment writes."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    found = set()
    for target in targets:
        elements = target.elts if isinstance(target, ast.Tuple) else [target]
        for element in elements:
            while isinstance(element, ast.Subscript):  # self.x[k] = ... writes x
                element = element.value
            if (isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name)
                    and element.value.id == "self"):
                found.add(element.attr)  # (self.x.y = ... writes x's y, not x)
    return found


def _class_attributes(cls: ast.ClassDef) -> set[str]:
    found = {statement.target.id for statement in cls.body
             if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)}
    for function in cls.body:
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                found |= _self_targets(node)
    return found


def engine_attributes() -> dict[str, tuple[str, set[str]]]:
    """Class name -> (its module, relative to sqlqueue/; its attributes)."""
    found = {}
    for module, names in CLASSES.items():
        tree = ast.parse((ENGINE / module).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in names:
                found[node.name] = (f"consuming/{module}", _class_attributes(node))
    return found


def _written_attributes(node: ast.AST) -> list[ast.Attribute]:
    """``x.attr`` written by ``node``: assigned, augmented, subscripted, deleted, or
    changed by a mutating call."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in MUTATING):
        targets = [node.func.value]
    written = []
    for target in targets:
        for element in target.elts if isinstance(target, ast.Tuple) else [target]:
            while isinstance(element, ast.Subscript):  # x.attr[k] = ... writes attr
                element = element.value
            if isinstance(element, ast.Attribute):  # a.b.c = ... writes c (of a.b)
                written.append(element)
    return written


def outside_writes() -> dict[str, set[str]]:
    """"Class.attribute" -> the modules (relative to sqlqueue/) writing it from outside."""
    attributes = engine_attributes()
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                _subclass_writes(node, module, attributes, found)
            for part in _written_attributes(node):
                name = _class_of(part, module, attributes)
                if name is not None and attributes[name][0] != module:
                    found.setdefault(f"{name}.{part.attr}", set()).add(module)
    return found


def _class_of(written: ast.Attribute, module: str,
              attributes: dict[str, tuple[str, set[str]]]) -> str | None:
    """The engine class whose attribute ``written`` is, as far as names tell: by the name
    of the object written to (``subscriber.stuck``, ``runner.pool.instruments``), else,
    in the modules that handle engine objects, by an attribute name only one class has.
    None: not an engine attribute (``self``'s are its own class's)."""
    receiver = written.value
    if isinstance(receiver, ast.Name) and receiver.id == "self":
        return None
    last = (receiver.id if isinstance(receiver, ast.Name)
            else receiver.attr if isinstance(receiver, ast.Attribute) else "")
    name = RECEIVERS.get(last)
    if name is not None:
        return name if written.attr in attributes[name][1] else None
    if not module.startswith(ENGINE_USERS):
        return None
    having = [name for name, (_, attrs) in attributes.items() if written.attr in attrs]
    return having[0] if len(having) == 1 else None


def _subclass_writes(cls: ast.ClassDef, module: str,
                     attributes: dict[str, tuple[str, set[str]]],
                     found: dict[str, set[str]]) -> None:
    """``self.x = ...`` in a subclass, defined in another module, of an engine class."""
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        if name in attributes and attributes[name][0] != module:
            for node in ast.walk(cls):
                for attr in _self_targets(node) & attributes[name][1]:
                    found.setdefault(f"{name}.{attr}", set()).add(module)


def documented() -> set[str]:
    text = DOC.read_text()
    assert SECTION in text, f"docs/internals.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+\.\w+)` \|", section, flags=re.MULTILINE))


def test_the_scan_sees_the_engine() -> None:
    attributes = engine_attributes()
    assert set(attributes) == {name for names in CLASSES.values() for name in names}
    assert {"pool", "pacer", "subscribers"} <= attributes["Runner"][1]
    assert {"partition_key", "watermark", "entries"} <= attributes["PartitionState"][1]


def test_the_scan_sees_a_write_from_outside() -> None:
    tree = ast.parse("subscriber.stuck.append(d)\nrunner.pool.instruments = x\n"
                     "self.owned = {}\nstate.entries[k] = e\n")
    written = [(ast.unparse(part.value), part.attr) for node in ast.walk(tree)
               for part in _written_attributes(node)]
    assert sorted(written) == [("runner.pool", "instruments"), ("self", "owned"),
                               ("state", "entries"), ("subscriber", "stuck")]


def test_every_attribute_is_in_the_table() -> None:
    found = {f"{name}.{attr}" for name, (_, attrs) in engine_attributes().items()
             for attr in attrs}
    table = documented()
    assert sorted(found - table) == [], "add these to docs/internals.md, Who owns what"
    assert sorted(table - found) == [], "these are no longer attributes: remove them"


def test_no_attribute_is_written_from_outside_its_module() -> None:
    unexpected = {key: sorted(modules - set(OUTSIDE_WRITES.get(key, {})))
                  for key, modules in outside_writes().items()}
    unexpected = {key: modules for key, modules in unexpected.items() if modules}
    assert unexpected == {}, ("give the owner a method for it (or list it in "
                              f"OUTSIDE_WRITES with its reason): {unexpected}")


def test_the_known_outside_writes_are_current() -> None:
    found = outside_writes()
    stale = {key: sorted(set(where) - found.get(key, set()))
             for key, where in OUTSIDE_WRITES.items()}
    assert {key: modules for key, modules in stale.items() if modules} == {}
    assert set(OUTSIDE_WRITES) <= documented()
