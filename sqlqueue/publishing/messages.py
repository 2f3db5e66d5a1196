"""Outgoing messages: what callers pass in, how it is checked, and what they get back.

Everything here is pure Python: validation happens before any SQL runs, so a refused
message leaves the caller's transaction exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from sqlqueue import naming, tracing
from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.conf import QueueSettings
from sqlqueue.exceptions import InvalidMessage
from sqlqueue.naming import (  # re-exported: the publishing API names them
    DEFAULT_PRIORITY as DEFAULT_PRIORITY,
)
from sqlqueue.naming import MAX_NAME_BYTES, MAX_PRIORITY, MIN_PRIORITY
from sqlqueue.naming import UNKEYED_PREFIX as UNKEYED_PREFIX  # re-exported
from sqlqueue.naming import unkeyed_partition as unkeyed_partition  # re-exported
from sqlqueue.storage.sql.base import MessageRow

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the furthest ahead a message may be scheduled, by ``delay`` or ``deliver_at`` (100
#: years): a message not yet due holds its ordered partition, and garbage collection of
#: its partition for every group, until it is due (SECURITY.md, I15)
MAX_DELAY_SECONDS = 100 * 365 * 86400


@dataclass(frozen=True)
class OutgoingMessage:
    """A message for ``send_messages``; the fields mean what ``send_message``'s arguments do."""

    payload: Any
    partition_key: str | None = None
    id: str | None = None
    metadata: Mapping[str, str] | None = None
    priority: int = DEFAULT_PRIORITY
    delay: float | timedelta | None = None
    deliver_at: datetime | None = None


@dataclass(frozen=True)
class SentMessage:
    """The stored message: ``created`` is False when ``id`` was already published."""

    topic: str
    partition_key: str
    id: str
    offset: int
    created: bool = field(default=True)


def check_message_name(kind: str, value: Any, *, max_bytes: int = MAX_NAME_BYTES) -> str:
    """A topic, partition key or id: a non-empty str of printable characters."""
    try:
        return naming.check_name(kind, value, max_bytes)
    except ValueError as problem:
        raise InvalidMessage(str(problem)) from None


def check_topic(topic: Any, conf: QueueSettings) -> str:
    # Leave room for the dead-letter suffix so that topic + DLQ_SUFFIX still fits.
    return check_message_name("topic", topic, max_bytes=conf.max_topic_bytes)


# One encoder for every payload: building one per call costs more than small payloads.
_PAYLOAD_ENCODER = DjangoJSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


#: The deepest nesting of lists and objects a payload may have (naming.MAX_JSON_DEPTH,
#: shared with the Spark writer). Deeper JSON is refused: every reader that walks it
#: recursively (the admin's pretty printer, a handler) can fail on it.
MAX_NESTING = naming.MAX_JSON_DEPTH


def encode_payload(payload: Any, conf: QueueSettings) -> bytes:
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
        data = text.encode("utf-8")
    except RecursionError:
        raise InvalidMessage(f"payload is nested deeper than {MAX_NESTING} levels "
                             "(lists and objects inside each other).") from None
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidMessage(f"payload cannot be encoded as JSON: {exc}") from exc
    # Only a text with that many brackets can be that deep: the walk is rarely needed.
    if text.count("[") + text.count("{") > MAX_NESTING and nesting(payload) > MAX_NESTING:
        raise InvalidMessage(f"payload is nested deeper than {MAX_NESTING} levels "
                             "(lists and objects inside each other).")
    if len(data) > conf.MAX_PAYLOAD_BYTES:
        raise InvalidMessage(
            f"payload is {len(data)} bytes as JSON; the limit is "
            f"{conf.MAX_PAYLOAD_BYTES} bytes (SQLQUEUE['MAX_PAYLOAD_BYTES'])."
        )
    return data


def nesting(value: Any) -> int:
    """How deep lists, tuples and dicts nest in ``value`` (0 for a scalar); iterative, so
    any depth is measured without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_NESTING:
            return deepest  # enough to refuse it
        stack.extend((child, depth + 1) for child in children)
    return deepest


def encode_metadata(metadata: Any, conf: QueueSettings) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidMessage(
            f"metadata must be a dict of str to str, not {type(metadata).__name__}."
        )
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise InvalidMessage(f"metadata keys must be str; got {key!r}.")
        if not isinstance(value, str):
            raise InvalidMessage(
                f"metadata values must be str; {key!r} is a {type(value).__name__}."
            )
        if "\x00" in key or "\x00" in value:
            # PostgreSQL's jsonb cannot hold one: refused on every database alike, before
            # anything is sent (guarantee I15), rather than a DataError on one of them.
            raise InvalidMessage(f"metadata {key[:50]!r} contains the NUL character "
                                 "(U+0000), which databases cannot store as text.")
    if not metadata:
        return None  # the RFC stores NULL for an empty map
    try:
        text = json.dumps(dict(metadata), ensure_ascii=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMessage("metadata is not valid Unicode text.") from exc
    if size > conf.MAX_PAYLOAD_BYTES:
        raise InvalidMessage(f"metadata is {size} bytes as JSON; the limit is "
                             f"{conf.MAX_PAYLOAD_BYTES} bytes.")
    return text


def check_priority(priority: Any) -> int:
    if type(priority) is int and MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return priority  # the common case
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidMessage(f"priority must be an integer, not {type(priority).__name__}.")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidMessage(
            f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}; got {priority}."
        )
    return priority


def schedule(delay: Any, deliver_at: Any, now_ms: int | None = None) -> tuple[int | None, int]:
    """(delay in ms, or None; absolute epoch ms, 0 for "at once"). Either is at most
    ``MAX_DELAY_SECONDS`` ahead; ``deliver_at`` of ``now_ms`` (the publisher's clock,
    epoch ms; now if None)."""
    if delay is None and deliver_at is None:
        return None, 0
    if delay is not None and deliver_at is not None:
        raise InvalidMessage("give either delay or deliver_at, not both.")
    if delay is not None:
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            seconds = float(delay)
        else:
            raise InvalidMessage(
                f"delay must be seconds or a timedelta, not {type(delay).__name__}."
            )
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidMessage(f"delay must be a finite number >= 0; got {delay!r}.")
        if seconds > MAX_DELAY_SECONDS:
            raise InvalidMessage(f"delay of {seconds:g}s is more than a century (at most "
                                 f"{MAX_DELAY_SECONDS:,}s: a message not yet due holds its "
                                 "partition).")
        return round(seconds * 1000), 0
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise InvalidMessage(
                f"deliver_at must be a datetime, not {type(deliver_at).__name__}."
            )
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidMessage(
                "deliver_at must be an aware datetime (use django.utils.timezone.now() "
                "or datetime.now(tz=...))."
            )
        micros = (deliver_at - EPOCH) // timedelta(microseconds=1)
        at_ms = max(0, -(-micros // 1000))  # round up: never deliver early
        latest_ms = (host_now_ms() if now_ms is None else now_ms) \
            + MAX_DELAY_SECONDS * 1000
        if at_ms > latest_ms:
            raise InvalidMessage(
                f"deliver_at {deliver_at.isoformat()} is more than a century ahead (at most "
                f"{MAX_DELAY_SECONDS // (365 * 86400)} years, as delay: a message not yet "
                "due holds its partition).")
        return None, at_ms
    return None, 0


# The variant nibble of a UUID (RFC 9562, section 4.1): 10xx in binary.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


#: random bytes for this many ids are read from the OS at once
_IDS_PER_READ = 256
_random_hex: list[str] = []  # 32 hex digits each, popped by new_message_id
# A forked child must never hand out the ids its parent still holds.
os.register_at_fork(after_in_child=_random_hex.clear)


def new_message_id(host_clock: HostClock = SYSTEM_CLOCK) -> str:
    """A UUID version 7 as text (RFC 9562: the Unix time in milliseconds, then 74 random
    bits), as ``str(uuid.uuid7())`` makes it on Python 3.14, in a fifth of the time of
    ``uuid.uuid4()`` (publishing makes one per message that has no id): the OS's random
    bytes are read for 256 ids at a time.

    Time first, so that the ids of a partition grow with its offsets: the unique
    ``(topic, partition_key, id)`` index is then written at its end and deleted from its
    start, as the log is, instead of on a random page of it for every message (garbage
    collection of a 2M-message backlog on MariaDB, 128 MB buffer pool, back to back:
    18,600 rows/s with random ids, reading that index from disk; 97,100 in id order)."""
    while True:
        try:
            h = _random_hex.pop()
            break
        except IndexError:  # empty (or emptied by another thread): read more
            block = os.urandom(16 * _IDS_PER_READ).hex()
            _random_hex.extend(block[i:i + 32] for i in range(0, len(block), 32))
    ms = f"{host_now_ms(host_clock):012x}"
    return f"{ms[:8]}-{ms[8:]}-7{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def prepare(topic: str, message: OutgoingMessage, conf: QueueSettings,
            published_at: int, trace_context: Any = tracing.CURRENT) -> MessageRow:
    """Validate one message for an already checked topic and turn it into a row.
    ``trace_context``: the trace context to carry (``tracing.inject``)."""
    return prepare_fields(topic, message.payload, message.partition_key, message.id,
                          message.metadata, message.priority, message.delay,
                          message.deliver_at, conf, published_at, trace_context)


def prepare_fields(topic: str, payload: Any, partition_key: Any, message_id: Any,
                   metadata: Any, priority: Any, delay: Any, deliver_at: Any,
                   conf: QueueSettings, published_at: int,
                   trace_context: Any = tracing.CURRENT) -> MessageRow:
    """``prepare`` of a message given as its fields (``send_message``'s arguments),
    without building an ``OutgoingMessage`` first."""
    fresh_id = message_id is None
    message_id = new_message_id() if fresh_id else check_message_name("id", message_id)
    if partition_key is None:
        partition_key = unkeyed_partition(message_id, conf.DEFAULT_PARTITIONS)
    else:
        partition_key = check_message_name("partition_key", partition_key)
    delay_ms, deliver_at_ms = schedule(delay, deliver_at, published_at)
    return MessageRow(
        topic=topic,
        partition_key=partition_key,
        id=message_id,
        payload=encode_payload(payload, conf),
        metadata=encode_metadata(tracing.inject(metadata, trace_context), conf),
        published_at=published_at,
        priority=check_priority(priority),
        delay_ms=delay_ms,
        deliver_at_ms=deliver_at_ms,
        fresh_id=fresh_id,
    )


def now_ms(host_clock: HostClock = SYSTEM_CLOCK) -> int:
    """The publisher's clock, for ``published_at`` (the RFC's producer timestamp): this
    host's wall clock (``sqlqueue.clocks``), not the database's (no round trip per
    publish)."""
    return host_now_ms(host_clock)


def host_now_ms(host_clock: HostClock = SYSTEM_CLOCK) -> int:
    """``host_clock``'s wall clock in epoch milliseconds (rounded down)."""
    return int(host_clock.wall() * 1000)


def idempotency_digest(topic: str, partition_key: str, message_id: str) -> tuple[int, int]:
    """The 128-bit key of (topic, partition_key, id) in ``queue_idempotency_keys``, as two
    signed 64-bit integers (BIGINT columns). Each part is length-prefixed, so no two
    different triples are encoded alike; at 128 bits, 10**10 stored keys collide with a
    probability below 10**-18."""
    blake = hashlib.blake2b(digest_size=16, person=b"sqlqueue.idem")
    for part in (topic, partition_key, message_id):
        encoded = part.encode("utf-8")
        blake.update(len(encoded).to_bytes(4, "big"))
        blake.update(encoded)
    digest = blake.digest()
    return (int.from_bytes(digest[:8], "big", signed=True),
            int.from_bytes(digest[8:], "big", signed=True))
