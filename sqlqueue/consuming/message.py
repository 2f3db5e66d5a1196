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


#: a ``Message``'s payload not decoded yet
_UNDECODED: Any = object()


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

    # The payload and the two times are made when first read (a batch handler that reads
    # a field of each message, or none, does not pay for the rest).
    __slots__ = (
        "_created_at_ms", "_extend", "_payload", "_published_at_ms", "attempt", "body",
        "consumer_group", "id", "metadata", "offset", "partition_key", "topic",
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
        self._payload: Any = _UNDECODED
        self.metadata = metadata
        self.attempt = attempt
        self._created_at_ms = created_at_ms
        self._published_at_ms = published_at_ms
        self.consumer_group = consumer_group
        self._extend = extend

    @property
    def payload(self) -> Any:
        """The JSON payload, decoded (``decode_payload``) when first read."""
        if self._payload is _UNDECODED:
            self._payload = decode_payload(self.body)
        return self._payload

    @property
    def created_at(self) -> datetime:
        """The database clock at insert (an aware datetime, UTC)."""
        return _datetime(self._created_at_ms)

    @property
    def published_at(self) -> datetime:
        """The publisher's clock when it was sent (an aware datetime, UTC)."""
        return _datetime(self._published_at_ms)

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
