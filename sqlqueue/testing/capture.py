"""``capture_messages``: what a block of the test published, read back from the log.

The log itself is the record: the newest offset of each queue database is noted when the
block starts, and the captured messages are the rows above it (of ``topic``, if given).
So whatever publishes is seen (``send_message``, ``send_messages``, a task's
``enqueue()``, the dead letters a run writes), a rolled-back block's messages are not
(they were never published), and a publish absorbed by its id (``created=False``)
stored nothing and adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

from django.db.models import Max

from sqlqueue.conf import get_settings
from sqlqueue.models import QueueMessage


@dataclass(frozen=True)
class CapturedMessage:
    """A stored message, as its consumers will see it (``SentMessage``'s names, plus what
    was published)."""

    topic: str
    partition_key: str
    id: str
    payload: Any
    metadata: dict[str, str] = field(default_factory=dict)
    offset: int = 0
    priority: int = 0
    deliver_after_ms: int = 0  # database time; 0: at once

    @property
    def created(self) -> bool:
        """As ``SentMessage.created``: a captured message was stored by the block (a
        publish absorbed by its id stores nothing, and is not captured)."""
        return True


class CapturedMessages(list[CapturedMessage]):
    """The messages published since the capture started, oldest first: read again from
    the database at each look while the block runs, fixed when it ends."""

    def __init__(self, topic: str | None, aliases: list[str]) -> None:
        super().__init__()
        self.topic = topic
        self._after = {alias: _newest_offset(alias) for alias in aliases}
        self._live = True

    def refresh(self) -> None:
        if self._live:
            self[:] = [message for alias, after in self._after.items()
                       for message in _read_after(alias, after, self.topic)]

    def freeze(self) -> None:
        self.refresh()
        self._live = False

    def __len__(self) -> int:
        self.refresh()
        return super().__len__()

    def __iter__(self) -> Iterator[CapturedMessage]:
        self.refresh()
        return super().__iter__()

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        self.refresh()
        return super().__getitem__(index)

    def __eq__(self, other: object) -> bool:
        self.refresh()
        return super().__eq__(other)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        self.refresh()
        return super().__repr__()

    @property
    def payloads(self) -> list[Any]:
        """The payloads alone, oldest first."""
        return [message.payload for message in self]


@contextmanager
def capture_messages(topic: str | None = None) -> Iterator[CapturedMessages]:
    """Record what is published inside the block (of ``topic``, or of every topic).

    Yields a list of ``CapturedMessage`` (``topic``, ``partition_key``, ``id``,
    ``payload``, ``metadata``, ``offset``), filled as messages are stored and fixed when
    the block ends::

        with capture_messages(topic="orders.created") as sent:
            place_order(...)
        assert sent[0].payload["total"] == "12.00"
    """
    captured = CapturedMessages(topic, _aliases(topic))
    try:
        yield captured
    finally:
        captured.freeze()


def _aliases(topic: str | None) -> list[str]:
    """The databases holding the queue tables for ``topic`` (every routed one if None)."""
    conf = get_settings()
    if topic is not None:
        return [conf.alias_for(topic)]
    return list(dict.fromkeys([conf.DATABASE, *(alias for _, alias in conf.ROUTES)]))


def _newest_offset(alias: str) -> int:
    newest = QueueMessage.objects.using(alias).aggregate(newest=Max("offset"))["newest"]
    return int(newest or 0)


def _read_after(alias: str, after: int, topic: str | None) -> list[CapturedMessage]:
    rows = QueueMessage.objects.using(alias).filter(offset__gt=after).order_by("offset")
    if topic is not None:
        rows = rows.filter(topic=topic)
    return [_captured(row) for row in rows]


def _captured(row: QueueMessage) -> CapturedMessage:
    metadata = row.metadata
    if isinstance(metadata, str):  # stored as JSON text by other programs
        metadata = json.loads(metadata)
    return CapturedMessage(
        topic=row.topic, partition_key=row.partition_key, id=row.id,
        payload=json.loads(bytes(row.payload).decode("utf-8")),
        metadata=dict(metadata or {}), offset=row.offset, priority=row.priority,
        deliver_after_ms=row.deliver_after,
    )
