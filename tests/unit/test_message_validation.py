from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from sqlqueue import InvalidMessage, OutgoingMessage, SqlqueueError
from sqlqueue.conf import QueueSettings
from sqlqueue.publishing.messages import (
    check_message_name,
    check_priority,
    check_topic,
    encode_metadata,
    encode_payload,
    new_message_id,
    prepare,
    schedule,
    unkeyed_partition,
)

CONF = QueueSettings()


def test_invalid_message_is_a_value_error_and_a_sqlqueue_error() -> None:
    assert issubclass(InvalidMessage, ValueError)
    assert issubclass(InvalidMessage, SqlqueueError)


@pytest.mark.parametrize(
    "value", ["", "a\x00b", "tab\tinside", "new\nline", "del\x7f", "c1\x85", "x" * 256, "é" * 128,
              "\u00a0" * 128, "ascii then \x85"]
)
def test_bad_names(value: str) -> None:
    with pytest.raises(InvalidMessage):
        check_message_name("partition_key", value)


@pytest.mark.parametrize("value", [None, 7, b"bytes", uuid.uuid4()])
def test_names_must_be_strings(value: Any) -> None:
    with pytest.raises(InvalidMessage, match="must be a string"):
        check_message_name("id", value)


def test_good_names_include_unicode_and_spaces() -> None:
    # Spaces inside a name (U+0020); not at its ends, nor other spaces such as U+00A0,
    # which show as U+0020 does (audit W7: tests/unit/test_text_safety.py).
    for value in ["orders.created", "customer 7", "ключ", "🦆", "x" * 255, "é" * 127,
                  "a b c"]:
        assert check_message_name("id", value) == value
    for value in ["no\u00a0break", " ", "trailing "]:
        with pytest.raises(InvalidMessage):
            check_message_name("id", value)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="not valid Unicode"):
        check_message_name("id", "\ud800")


def test_topic_leaves_room_for_the_dead_letter_suffix() -> None:
    assert check_topic("t" * 251, CONF)
    with pytest.raises(InvalidMessage, match="251 bytes"):
        check_topic("t" * 252, CONF)


def test_payload_is_compact_json_with_django_types() -> None:
    data = encode_payload(
        {"when": datetime(2026, 1, 2, tzinfo=UTC), "total": Decimal("1.50"), "é": 1}, CONF
    )
    assert data == '{"when":"2026-01-02T00:00:00Z","total":"1.50","é":1}'.encode()


@pytest.mark.parametrize("payload", [object(), {1, 2}, float("nan"), b"raw"])
def test_unencodable_payloads(payload: Any) -> None:
    with pytest.raises(InvalidMessage, match="cannot be encoded"):
        encode_payload(payload, CONF)


def test_payload_size_limit_counts_encoded_bytes() -> None:
    small = QueueSettings(MAX_PAYLOAD_BYTES=10)
    assert encode_payload("12345678", small) == b'"12345678"'
    with pytest.raises(InvalidMessage, match="11 bytes"):
        encode_payload("123456789", small)


def test_metadata() -> None:
    assert encode_metadata(None, CONF) is None
    assert encode_metadata({}, CONF) is None
    assert encode_metadata({"trace": "abc"}, CONF) == '{"trace":"abc"}'
    for bad in ({"n": 1}, {1: "x"}, ["trace"], "trace=abc"):
        with pytest.raises(InvalidMessage, match="metadata"):
            encode_metadata(bad, CONF)


@pytest.mark.parametrize("priority", [-1, 256, 1.0, "50", True, None])
def test_bad_priorities(priority: Any) -> None:
    with pytest.raises(InvalidMessage, match="priority"):
        check_priority(priority)


def test_priority_bounds_are_inclusive() -> None:
    assert check_priority(0) == 0 and check_priority(255) == 255


def test_schedule() -> None:
    assert schedule(None, None) == (None, 0)
    assert schedule(1.5, None) == (1500, 0)
    assert schedule(timedelta(minutes=1), None) == (60_000, 0)
    at = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert schedule(None, at) == (None, int(at.timestamp() * 1000))
    assert schedule(None, at + timedelta(microseconds=1)) == (None, int(at.timestamp() * 1000) + 1)


@pytest.mark.parametrize(
    ("delay", "deliver_at", "match"),
    [
        (-1, None, "delay"),
        (float("inf"), None, "delay"),
        ("5", None, "delay"),
        (True, None, "delay"),
        (timedelta(seconds=-1), None, "delay"),
        (None, datetime(2030, 1, 1), "aware"),
        (None, "2030-01-01", "deliver_at"),
        (1, datetime(2030, 1, 1, tzinfo=UTC), "not both"),
    ],
)
def test_bad_schedules(delay: Any, deliver_at: Any, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        schedule(delay, deliver_at)


def test_unkeyed_messages_spread_deterministically() -> None:
    keys = {unkeyed_partition(str(uuid.uuid4()), 16) for _ in range(2000)}
    assert keys == {f"default-{i}" for i in range(16)}
    assert unkeyed_partition("order-1", 16) == unkeyed_partition("order-1", 16)


def test_new_message_ids_are_uuid7_text_in_time_order() -> None:
    """UUIDv7 (issue 52): the time first, so that a partition's ids grow with its offsets
    and its unique index is written at its end, as the log is."""
    import time

    before = time.time_ns() // 1_000_000
    ids = [new_message_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lower-case hex with dashes, as str(uuid7()) makes it
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after  # its first 48 bits: the Unix time in ms
    # Drawn in two different milliseconds, they sort (as bytes, as the index does) in time.
    first = new_message_id()
    while time.time_ns() // 1_000_000 <= int(first[:8] + first[9:13], 16):
        time.sleep(0.001)
    assert first < new_message_id()


def test_a_forked_child_never_repeats_its_parents_pending_ids() -> None:
    """Random bytes are read for many ids at once; a child made by fork() must not hand
    out the ones its parent holds (both would publish the same "unique" ids)."""
    import os

    new_message_id()  # the parent now holds unused random bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, "\n".join(new_message_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split("\n"))
    os.waitpid(pid, 0)
    parent = {new_message_id() for _ in range(300)}
    assert len(child) == 300 and not child & parent


def test_prepare_fills_id_and_partition() -> None:
    row = prepare("t", OutgoingMessage({"a": 1}), CONF, published_at=123)
    assert uuid.UUID(row.id)
    assert row.partition_key.startswith("default-")
    assert (row.payload, row.published_at, row.priority) == (b'{"a":1}', 123, 50)


@pytest.mark.parametrize("depth", [101, 10_000, 100_000])
def test_a_payload_nested_too_deeply_is_refused(depth: int) -> None:
    from sqlqueue.conf import QueueSettings
    from sqlqueue.publishing.messages import MAX_NESTING, encode_payload

    payload: object = "leaf"
    for _ in range(depth):
        payload = [payload]
    with pytest.raises(InvalidMessage, match=f"nested deeper than {MAX_NESTING} levels"):
        encode_payload(payload, QueueSettings(MAX_PAYLOAD_BYTES=1 << 30))


def test_a_payload_at_the_nesting_limit_is_accepted() -> None:
    from sqlqueue.conf import QueueSettings
    from sqlqueue.publishing.messages import MAX_NESTING, encode_payload

    payload: object = {"k": 1}
    for _ in range(MAX_NESTING - 1):
        payload = {"k": payload}
    assert encode_payload(payload, QueueSettings()).count(b"{") == MAX_NESTING
