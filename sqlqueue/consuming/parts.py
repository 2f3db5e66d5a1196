"""What every part of ``Subscriber`` (``Delivering``, ``Watermarks``) reads from it:
declared once, for the type checker; ``Subscriber`` provides it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue.consuming.partition import PartitionState
from sqlqueue.storage.sql import Dialect


class SubscriberPart:
    """A mixin of ``Subscriber``: one group on one topic, its partitions by key."""

    partitions: dict[str, PartitionState]
    if TYPE_CHECKING:
        @property
        def group(self) -> str: ...
        @property
        def topic(self) -> str: ...
        @property
        def dialect(self) -> Dialect: ...
