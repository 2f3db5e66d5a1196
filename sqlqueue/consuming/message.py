"""What a handler receives (``Message``) and what it may raise (``Retry``, ``Reject``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlqueue.exceptions import SqlqueueError


class Retry(SqlqueueError):
    """Raise from a handler to have the message redelivered later.

    ``delay`` (seconds or timedelta) overrides the exponential backoff. The attempt
    counts towards ``max_attempts``.
    """

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and (not isinstance(seconds, int | float) or seconds < 0):
            raise ValueError(f"Retry delay must be >= 0 seconds; got {delay!r}.")
        self.delay = None if seconds is None else float(seconds)
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={self.delay})")


class Reject(SqlqueueError):
    """Raise from a handler to dead-letter the message now, without further attempts."""

    def __init__(self, reason: str = "rejected by the handler") -> None:
        self.reason = reason
        super().__init__(reason)


def _datetime(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


def decode_payload(raw: bytes) -> Any:
    """The JSON payload; bytes that are not UTF-8 JSON, or nest too deep to decode (a row
    written by another RFC implementation), are handed over unchanged (guarantee I15)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return raw


class Message:
    """One delivery of a message to a consumer group's handler."""

    __slots__ = (
        "_extend", "attempt", "body", "consumer_group", "created_at", "id", "metadata",
        "offset", "partition_key", "payload", "published_at", "topic",
    )

    def __init__(
        self, *, topic: str, partition_key: str, offset: int, id: str,
        body: bytes, metadata: dict[str, str], attempt: int, created_at_ms: int,
        published_at_ms: int, consumer_group: str,
        extend: Callable[[float], None] | None = None,
    ) -> None:
        self.topic = topic
        self.partition_key = partition_key
        self.offset = offset
        self.id = id
        self.body = body
        self.payload: Any = decode_payload(body)
        self.metadata = metadata
        self.attempt = attempt
        self.created_at = _datetime(created_at_ms)
        self.published_at = _datetime(published_at_ms)
        self.consumer_group = consumer_group
        self._extend = extend

    def extend_visibility(self, seconds: float | timedelta) -> None:
        """Keep this message invisible to redelivery for ``seconds`` from now (database
        clock). Call it from long handlers before the visibility timeout runs out."""
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"extend_visibility needs a positive duration; got {seconds!r}.")
        if self._extend is None:
            raise SqlqueueError("This message is not being delivered; nothing to extend.")
        self._extend(float(value))

    def __repr__(self) -> str:
        return (
            f"<Message {self.topic}/{self.partition_key}@{self.offset} id={self.id!r} "
            f"group={self.consumer_group!r} attempt={self.attempt}>"
        )
