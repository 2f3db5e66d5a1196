"""The store's interface (``sqlqueue.storage.protocols``): ``Store`` has every member of
every protocol, with the protocol's signature; the engine's in-memory store has every
member of the engine's protocols, with the same parameters, and is not a ``Store`` (what
it lacks is then missing, not inherited code that fails at run time on its cursor).
mypy checks the types (``protocols._store_implements_every_protocol``,
``tests.engine.memory.base.DatabaseWrapper.sqlqueue_store``); the parity test
(tests/integration/test_memory_store_parity.py) checks the answers."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from sqlqueue.storage.protocols import ENGINE_PROTOCOLS, PROTOCOLS, EngineStore
from sqlqueue.storage.sql.base import Store
from tests.engine.memory.conformance import protocol_members
from tests.engine.memory.store import MemoryStore


def _parameters(member: Any) -> list[tuple[str, object, object]] | None:
    """Names, kinds and defaults of a method's parameters (None: not a method)."""
    if not callable(member):
        return None
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


def test_the_protocols_name_something() -> None:
    assert all(protocol_members([protocol]) for protocol in PROTOCOLS)
    assert protocol_members([EngineStore]) == protocol_members(ENGINE_PROTOCOLS)
    assert "fetch_partitions" in protocol_members(ENGINE_PROTOCOLS)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_store_has_every_member_of_every_protocol(protocol: type) -> None:
    for name in sorted(protocol_members([protocol])):
        assert hasattr(Store, name), f"Store lacks {protocol.__name__}.{name}"
        wanted = getattr(protocol, name, None)
        if wanted is not None:
            assert _parameters(getattr(Store, name)) == _parameters(wanted), name


@pytest.mark.parametrize("protocol", ENGINE_PROTOCOLS, ids=lambda p: p.__name__)
def test_the_memory_store_has_every_member_of_the_engine_protocols(protocol: type) -> None:
    for name in sorted(protocol_members([protocol])):
        assert hasattr(MemoryStore, name), f"MemoryStore lacks {protocol.__name__}.{name}"
        wanted = getattr(protocol, name, None)
        if wanted is not None:
            assert _parameters(getattr(MemoryStore, name)) == _parameters(wanted), name


def test_the_memory_store_is_not_a_store() -> None:
    assert not issubclass(MemoryStore, Store)
    assert not any(issubclass(base, Store) for base in MemoryStore.__mro__)
