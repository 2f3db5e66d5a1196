"""A call tracer for the engine's call trees (``sys.setprofile``): which files of the
package call which, while one call tree runs (a publish, a runner's pass, a handler run).

Every call of a function defined in a file of ``sqlqueue/`` is attributed to the nearest
frame below it that is one too (frames of Django, the standard library or the tests in
between are looked through: ``atomic``, the in-memory store). Code run at import time
(a module's body, and what it calls) is left out. Leaves (settings, names, the metrics
hooks: called from everywhere, calling nothing back) are left out as ``LEAVES`` says.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import sqlqueue

PACKAGE = Path(sqlqueue.__file__).resolve().parent
#: files that every part reads and that call nothing back: not counted
LEAVES = frozenset({
    "conf.py", "naming.py", "events.py", "literals.py", "exceptions.py", "tracing.py",
    "database_names.py", "setting_converters.py", "consuming/instruments.py",
})
_PREFIX = str(PACKAGE) + "/"


def package_file(frame: FrameType) -> str | None:
    """The file of ``frame`` relative to ``sqlqueue/``, or None outside the package."""
    name = frame.f_code.co_filename
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else None


@dataclass
class CallTree:
    """What one traced call tree did, file by file."""

    #: (caller file, callee file) -> the callee functions called along that edge
    edges: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    files: set[str] = field(default_factory=set)
    #: the storage files each statement crossed: one set per call into ``storage/``
    #: from outside it
    statements: list[set[str]] = field(default_factory=list)

    def graph(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for caller, callee in self.edges:
            out[caller].add(callee)
        return out

    def cycles(self, allowed: Callable[[str, str, str], bool] = lambda *call: False,
               ) -> list[list[str]]:
        """The strongly connected components of more than one file, once the calls
        ``allowed(caller, callee, function)`` says are named callbacks are left out."""
        graph: dict[str, set[str]] = defaultdict(set)
        for (caller, callee), functions in self.edges.items():
            if any(not allowed(caller, callee, f) for f in functions):
                graph[caller].add(callee)
        return [sorted(c) for c in _components(graph, self.files) if len(c) > 1]


class Tracer:
    """``trace()`` records one call tree into a ``CallTree``."""

    def __init__(self) -> None:
        self.tree = CallTree()
        # id(frame) -> (its package file, the storage entry it belongs to, or None)
        self._frames: dict[int, tuple[str, int | None]] = {}
        self._outside: set[int] = set()  # the frames below the traced call

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = package_file(frame)
        if callee is None:
            return
        caller, entry = None, None
        back = frame.f_back
        while back is not None and id(back) not in self._outside:
            if back.f_code.co_name == "<module>":
                return  # import time
            known = self._frames.get(id(back))
            if known is not None and package_file(back) is not None:
                caller, entry = known
                break
            back = back.f_back
        if callee in LEAVES:
            return
        if callee.startswith("storage/"):
            if entry is None or caller is None or not caller.startswith("storage/"):
                self.tree.statements.append(set())
                entry = len(self.tree.statements) - 1
            self.tree.statements[entry].add(callee)
        else:
            entry = None
        self._frames[id(frame)] = (callee, entry)
        self.tree.files.add(callee)
        if caller is not None and caller != callee:
            self.tree.edges[(caller, callee)].add(frame.f_code.co_name)

    @contextmanager
    def trace(self) -> Iterator[CallTree]:
        self.tree, self._frames = CallTree(), {}
        frame: FrameType | None = sys._getframe()
        self._outside = set()
        while frame is not None:
            self._outside.add(id(frame))
            frame = frame.f_back
        sys.setprofile(self._profile)
        try:
            yield self.tree
        finally:
            sys.setprofile(None)


def traced(call: Callable[[], object]) -> CallTree:
    """Run ``call`` under a fresh tracer; its call tree."""
    with Tracer().trace() as tree:
        call()
    return tree


def _components(graph: dict[str, set[str]], nodes: set[str]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for root in sorted(nodes | set(graph)):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(component)
    return found
