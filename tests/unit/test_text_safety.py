"""Text from messages and handlers made safe where it is stored or shown, and checked
in bounded time (sqlqueue.naming; no database)."""

from __future__ import annotations

import time

import pytest

from sqlqueue.naming import (
    MAX_JSON_DEPTH,
    MAX_STORED_TEXT_CHARS,
    check_json_depth,
    json_depth,
    storable_text,
)

# -- storable_text (SPEC I15) ------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("plain", "plain"),
    ("a\x00b", "a\ufffdb"),
    ("lone \ud800 and \udfff", "lone \ufffd and \ufffd"),
    ("bidi \u202e and emoji \U0001f600 stay", "bidi \u202e and emoji \U0001f600 stay"),
    (b"\x00", "b'\\x00'"),
    (42, "42"),
])
def test_storable_text_replaces_what_no_database_stores(value: object, expected: str) -> None:
    assert storable_text(value) == expected


def test_storable_text_keeps_the_start_and_the_end_of_a_long_text() -> None:
    text = "start" + "\x00" * 5_000_000 + "end"
    stored = storable_text(text)
    assert len(stored) <= MAX_STORED_TEXT_CHARS
    assert stored.startswith("start") and stored.endswith("end")
    assert "[... truncated ...]" in stored and "\x00" not in stored


def test_storable_text_never_raises() -> None:
    class Hostile(str):
        def __str__(self) -> str:
            raise RecursionError("maximum recursion depth exceeded")

    class NoStr:
        def __str__(self) -> str:
            raise ValueError("no")

    assert storable_text(NoStr()).endswith("NoStr whose str() failed>")
    assert storable_text(Hostile("x")).endswith("Hostile whose str() failed>")


# -- json_depth (N2: linear time) ----------------------------------------------------------


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ("[]", 1), ("[1,[2,{}]]", 3), ('{"a": [{"b": "]]]"}]}', 3),
    ('["[[[", "\\"[["]', 1), ('["\\\\", [1]]', 2), ('"[[[', 0), ("[[[", 3),
])
def test_json_depth_counts_only_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_the_depth_check_takes_linear_time_on_an_unterminated_string() -> None:
    """The audit's input (N2): deep enough to be scanned, then an unterminated string of
    escaped quotes. A backtracking pattern took 27 s on 64 KiB (hours on 1 MiB); one pass
    takes a fraction of a second: the bound below only catches a hang, not a benchmark."""
    hostile = "[" * (MAX_JSON_DEPTH + 1) + '"' + '\\"' * (512 * 1024)  # 1 MiB
    started = time.monotonic()
    with pytest.raises(ValueError, match="more than 100 deep"):
        check_json_depth("payload", hostile)
    assert json_depth("[" + '"' + '\\"' * (512 * 1024)) == 1
    took = time.monotonic() - started
    # Bounds a hang, not a speed: backtracking would take hours here.
    assert took < 60, f"the depth check did not finish in {took:.0f} s: it backtracks"


def test_the_depth_check_uses_no_pattern_that_matches_whole_strings() -> None:
    """Held by construction: the only pattern json_depth uses matches one character."""
    import sqlqueue.naming as naming

    patterns = [value.pattern for value in vars(naming).values()
                if hasattr(value, "pattern") and hasattr(value, "finditer")]
    assert r'[\[\]{}"\\]' in patterns
    assert not [p for p in patterns if "*" in p or "+" in p]
