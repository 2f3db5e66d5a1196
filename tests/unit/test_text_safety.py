"""Text from messages and handlers made safe where it is stored or shown, and checked
in bounded time (sqlqueue.naming; no database)."""

from __future__ import annotations

import time

import pytest

from sqlqueue.naming import (
    MAX_JSON_DEPTH,
    MAX_STORED_TEXT_CHARS,
    check_json_depth,
    check_name,
    escape_controls,
    json_depth,
    storable_text,
)

# -- storable_text (guarantee I15) ------------------------------------------------------------


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


# -- look-alike names (audit W7) ---------------------------------------------------------

#: name -> what the refusal says: each shows as "orders" (or as another name) in the
#: admin, a terminal or a log
LOOK_ALIKES = {
    "orders\u3164": "blank or invisible character U+3164 (HANGUL FILLER)",
    "orders\u115f": "blank or invisible character U+115F (HANGUL CHOSEONG FILLER)",
    "orders\u1160": "blank or invisible character U+1160 (HANGUL JUNGSEONG FILLER)",
    "orders\uffa0": "blank or invisible character U+FFA0 (HALFWIDTH HANGUL FILLER)",
    "orders\u2800": "blank or invisible character U+2800 (BRAILLE PATTERN BLANK)",
    "ord\u00a0ers": "blank or invisible character U+00A0 (NO-BREAK SPACE)",
    "ord\u3000ers": "blank or invisible character U+3000 (IDEOGRAPHIC SPACE)",
    "ord\u2009ers": "blank or invisible character U+2009 (THIN SPACE)",
    "orders\ue000": "blank or invisible character U+E000 (a private-use character)",
    "orders\uffff": "blank or invisible character U+FFFF (a noncharacter)",
    "orders\ufdd0": "blank or invisible character U+FDD0 (a noncharacter)",
    "orders\U0010fffe": "blank or invisible character U+10FFFE (a noncharacter)",
    "orders\u034f": "blank or invisible character U+034F (COMBINING GRAPHEME JOINER)",
    "orders\u180e": "invisible character U+180E",  # Cf since Unicode 6.3
    "orders\u0336": "combining mark U+0336 (COMBINING LONG STROKE OVERLAY) on 's'",
    "orders\ufe0f": "combining mark U+FE0F (VARIATION SELECTOR-16) on 's'",
    "\u0301orders": "combining mark U+0301 (COMBINING ACUTE ACCENT) at its start",
    "orders ": "ends with whitespace",
    " orders": "begins with whitespace",
    "orders\u3000": "blank or invisible character U+3000",
    "cafe\u0301": "is not in Unicode's composed form (NFC): it shows as 'caf\u00e9'",
}


@pytest.mark.parametrize(("name", "says"), LOOK_ALIKES.items(),
                         ids=[ascii(name) for name in LOOK_ALIKES])
def test_a_look_alike_name_is_refused_with_what_is_wrong(name: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_name("topic", name)
    assert says in str(refused.value)
    assert str(refused.value).startswith("topic ")


@pytest.mark.parametrize("name", [
    "orders", "order lines", "caf\u00e9", "\u6ce8\u6587", "\u0928\u093f\u0930",
    "\u05e9\u05c1\u05dc\u05d5\u05dd", "\u2764\ufe0f", "\U0001f600", "\U0001fae8",
    "\u0e01\u0e34\u0e19",
])
def test_names_in_any_script_stay_accepted(name: str) -> None:
    # Marks on letters of other scripts (Devanagari, Hebrew points, Thai), an emoji's
    # variation selector, and an emoji newer than the Unicode of Python 3.11 (U+1FAE8).
    assert check_name("topic", name) == name


def test_the_command_line_escapes_what_names_may_no_longer_hold() -> None:
    # Names stored before this rule (or by another program) are shown escaped.
    shown = escape_controls("a\u00a0b\u3164c\u2800d\ue000e\uffff f")
    assert shown == "a\\u00a0b\\u3164c\\u2800d\\ue000e\\uffff f"
    assert escape_controls(shown) == shown
