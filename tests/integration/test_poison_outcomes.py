"""guarantee I15, no poison outcome: nothing a handler raises or returns, and nothing another
program wrote into the table, stops a runner or a partition. Error texts are stored made
safe (NUL and lone surrogates replaced, capped); after max_attempts the message is a dead
letter with its real error, and the partition's next message is handled at once (no
reconnect backoff). Run on SQLite, MariaDB/MySQL and PostgreSQL (which refuses NUL in
text and jsonb)."""

from __future__ import annotations

import logging
import random
import sys
from typing import Any

import pytest
from django.db import connection

import sqlqueue
from sqlqueue import InvalidMessage, Message, OutgoingMessage, send_message, send_messages
from sqlqueue.consuming.outcomes import DeadLetterCopy, RetryAt, copy_to_dead_letters, write_acks
from sqlqueue.models import DeliveryState, QueueMessage
from sqlqueue.naming import MAX_STORED_TEXT_CHARS, storable_text
from sqlqueue.storage.sql import store_for
from tests.integration.consuming_helpers import drain, register

__all__ = ["register"]  # the fixture

HOSTILE = "\x00\ud800\udfff\u202e\u2066\u200b\u2028\x1b]0;PWN\x07\U0010ffff"

FUZZ_SEED = 36
FUZZ_EXAMPLES = 60


def error_texts(rng: random.Random, count: int) -> list[str]:
    """Error texts a handler can produce (a seeded generator: the same texts each run):
    any code point (NUL, lone surrogates, bidi and format characters included), hostile
    ones often, and now and then far over the cap."""
    texts = []
    for _ in range(count):
        shape = rng.random()
        if shape < 0.4:
            texts.append("".join(chr(rng.randrange(0x110000))
                                 for _ in range(rng.randrange(200))))
        elif shape < 0.85:
            texts.append("".join(rng.choice([*HOSTILE, "a", "\u00e9", "\n"])
                                 for _ in range(rng.randrange(200))))
        else:
            unit = rng.choice(["\x00", "\ud800x", "\u202e\u00e9", "\U0001f600"])
            size = rng.randrange(MAX_STORED_TEXT_CHARS // 2, MAX_STORED_TEXT_CHARS + 5000)
            texts.append(unit * size)
    return texts


@pytest.mark.django_db(transaction=True)
def test_any_error_text_is_recorded_made_safe() -> None:
    """The fuzzer: a retry's error and a dead letter's error, written through the one
    writer of outcomes, are stored (never a database error) as ``storable_text``."""
    sent = send_message("fuzz", {"n": 1}, partition_key="k")
    store = store_for(connection)
    for n, text in enumerate(error_texts(random.Random(FUZZ_SEED), FUZZ_EXAMPLES)):
        with connection.cursor() as cursor:
            write_acks(cursor, store, "g", "fuzz", [],
                       [RetryAt("k", sent.offset, invisible_until=0, error=text)])
            copy_to_dead_letters(cursor, store, dead_letter_topic="fuzz_dlq", group=f"g{n}",
                                 copies=[DeadLetterCopy(sent.id, sent.offset, 1, text,
                                                        "max_attempts")])
        expected = storable_text(text)
        assert "\x00" not in expected and len(expected) <= MAX_STORED_TEXT_CHARS
        expected.encode("utf-8")  # no lone surrogate left
        stored = DeliveryState.objects.get(consumer_group="g", topic="fuzz",
                                           partition_key="k",
                                           message_offset=sent.offset).last_error
        dead = QueueMessage.objects.get(topic="fuzz_dlq", consumer_group=f"g{n}")
        assert stored == expected, n
        assert dead.last_error == expected, n


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class NotAnException(BaseException):
    pass


class NanRetry(sqlqueue.Retry):
    def __init__(self) -> None:
        super().__init__(reason="nan")
        self.delay = float("nan")


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def _raise_recursion(payload: Any) -> None:
    _recurse(0)


def _raise(exc: BaseException) -> Any:
    def handler(payload: Any) -> None:
        raise exc
    return handler


def _raise_with_payload(payload: Any) -> None:
    raise ValueError(f"unknown sku {payload['sku']}")


def _raise_keyerror(payload: Any) -> None:
    raise KeyError(payload["sku"])


# (handler of the first message's payload, what its stored error must contain)
HOSTILE_HANDLERS = {
    "nul-from-the-payload": (_raise_with_payload, "unknown sku A\ufffdB"),
    "keyerror-with-nul": (_raise_keyerror, "KeyError"),
    "lone-surrogates": (_raise(ValueError("bad \ud800 and \udfff")), "bad \ufffd and \ufffd"),
    "bidi-overrides": (_raise(ValueError("evil\u202etxt.exe\u2066")), "evil\u202etxt.exe"),
    "megabytes": (_raise(ValueError("x" * 5_000_000)), "[... truncated ...]"),
    "str-and-repr-raise": (_raise(StrRaises()), "StrRaises"),
    "recursion-error": (_raise_recursion, "RecursionError"),
    "reject-with-nul": (_raise(sqlqueue.Reject("no \x00 thanks")), "no \ufffd thanks"),
    "reject-not-a-str": (_raise(sqlqueue.Reject(b"\x00bytes" * 10)), "bytes"),  # type: ignore[arg-type]
    "reject-megabytes": (_raise(sqlqueue.Reject("\x00" * 3_000_000)), "[... truncated ...]"),
    "system-exit": (_raise(SystemExit(3)), "SystemExit: 3"),
    "a-base-exception": (_raise(NotAnException("\x00 raw")), "NotAnException: \ufffd raw"),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", sorted(HOSTILE_HANDLERS))
def test_a_hostile_failure_neither_holds_the_partition_nor_stops_the_runner(
    register: Any, case: str, caplog: pytest.LogCaptureFixture,
) -> None:
    fail, expected = HOSTILE_HANDLERS[case]
    handled: list[int] = []

    def handler(message: Message) -> None:
        if message.payload["n"] == 0:
            fail(message.payload)
        handled.append(message.payload["n"])

    register("sku", "pricing", handler, ordered=True, max_attempts=2)
    send_messages("sku", [OutgoingMessage({"n": n, "sku": "A\x00B"}, partition_key="p")
                          for n in range(3)])
    limit = sys.getrecursionlimit()
    with caplog.at_level(logging.WARNING, logger="sqlqueue"):
        runner = drain(["pricing"])
    assert sys.getrecursionlimit() == limit
    # The ordered partition went on at once: no visibility timeout, no reconnect.
    assert handled == [1, 2]
    assert not [r for r in caplog.records if "Database error" in r.getMessage()]
    assert runner.exit_code == 0
    dead = QueueMessage.objects.get(topic="sku_dlq")
    assert expected in dead.last_error
    assert "\x00" not in dead.last_error
    assert len(dead.last_error) <= MAX_STORED_TEXT_CHARS
    assert dead.failure_detail["reason"] in ("max_attempts", "rejected")
    assert "never completed" not in dead.last_error


@pytest.mark.django_db(transaction=True)
def test_a_retry_with_an_unusable_delay_does_not_stop_the_runner(register: Any) -> None:
    """``Retry(delay=inf)`` waits the longest delay honoured (a year), a NaN delay (set by
    a subclass) the consumer's backoff; their reasons are stored made safe."""
    from sqlqueue.consuming.registry import select_consumers
    from sqlqueue.consuming.runner import Runner
    from tests.integration.consuming_helpers import fast_settings

    handled: list[int] = []

    def handler(message: Message) -> None:
        if message.payload == 0:
            raise sqlqueue.Retry(delay=float("inf"), reason="forever \x00")
        if message.payload == 1:
            raise NanRetry()
        handled.append(message.payload)

    register("r", "g", handler, max_attempts=5)
    sent = send_messages("r", [0, 1, 2])
    runner = Runner(select_consumers(["g"]), max_messages=3, conf=fast_settings())
    assert runner.run(install_signal_handlers=False) == 0
    assert handled == [2]
    states = {s.message_offset: s for s in DeliveryState.objects.filter(consumer_group="g")}
    forever, nan = states[sent[0].offset], states[sent[1].offset]
    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
    a_year = 365 * 24 * 3600  # the longest delay honoured (handlers.MAX_RETRY_DELAY)
    assert forever.invisible_until > now + 1000 * (a_year - 3600)
    assert "forever \ufffd" in forever.last_error and "\x00" not in forever.last_error
    assert nan.invisible_until < now + 60_000 and "NanRetry" in nan.last_error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("metadata", [{"k": "a\x00b"}, {"a\x00b": "v"}])
def test_metadata_with_nul_is_refused_on_every_database(metadata: dict[str, str]) -> None:
    with pytest.raises(InvalidMessage, match="NUL character"):
        send_message("t", 1, metadata=metadata)
    good = [OutgoingMessage(n) for n in range(1200)]
    with pytest.raises(InvalidMessage, match="NUL character"):
        send_messages("t", [*good, OutgoingMessage(1, metadata=metadata)])
    assert not QueueMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_rows_other_programs_wrote_cannot_stop_a_partition(register: Any) -> None:
    """A payload nested too deep to decode is handed over as bytes; a failure detail that
    is not an object leaves the row's id; the partition goes on."""
    seen: list[Any] = []
    register("other", "g", lambda m: seen.append(m.payload), ordered=True)
    deep = b"[" * 200_000 + b"]" * 200_000
    with connection.cursor() as cursor:
        for n, (payload, detail) in enumerate([(deep, '"a string"'), (deep, "[[[[1]]]]"),
                                               (b'{"n": 3}', None)]):
            cursor.execute(
                "INSERT INTO queue_messages (topic, id, payload, metadata, partition_key, "
                "created_at, published_at, failed_at, failure_count, last_error, "
                "original_topic, failure_detail) "
                "VALUES ('other', %s, %s, NULL, 'k', 1, 1, 0, 0, '', '', %s)",
                [f"r-{n}", payload, detail],
            )
    drain(["g"])
    assert seen == [deep, deep, {"n": 3}]
