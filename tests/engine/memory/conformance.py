"""The members a store protocol declares (``sqlqueue.storage.protocols``), read off the
classes: what the parity test must reach and the protocol tests compare."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


def protocol_members(protocols: Iterable[type]) -> set[str]:
    """Every method and attribute the protocols (and the protocols they extend) name."""
    names: set[str] = set()
    for protocol in protocols:
        for cls in protocol.__mro__:
            if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
                continue
            names |= {name for name in (*vars(cls), *vars(cls).get("__annotations__", {}))
                      if not name.startswith("_")}
    return names
