"""``make_message``: a ``Message`` as a handler receives it, for unit tests of handlers
(nothing is published or stored)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from sqlqueue.consuming.message import Message


def make_message(payload: Any, *, topic: str = "test.topic", group: str = "test",
                 partition_key: str = "test-partition", id: str = "test-message",
                 offset: int = 1, attempt: int = 1, metadata: dict[str, str] | None = None,
                 published_at: datetime | None = None) -> Message:
    """A delivery of ``payload`` (encoded and decoded as ``send_message`` would: a
    ``Decimal`` arrives as a string) to ``group``'s handler, as attempt ``attempt``."""
    at_ms = round((published_at or timezone.now()).timestamp() * 1000)
    return Message(
        topic=topic, partition_key=partition_key, offset=offset, id=id,
        body=DjangoJSONEncoder().encode(payload).encode("utf-8"), metadata=dict(metadata or {}),
        attempt=attempt, created_at_ms=at_ms, published_at_ms=at_ms, consumer_group=group)
