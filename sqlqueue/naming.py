"""The rule for names (topics, partition keys, ids, groups), and text made safe where it
is stored (``storable_text``), shown (``escape_controls``) or logged (``redacted_url``),
without Django: the publishing API, the consumer engine, the commands and the Spark
executors, which must not import Django, share it."""

from __future__ import annotations

import re
import unicodedata
import zlib
from typing import Any

MAX_NAME_BYTES = 255  # VARCHAR(255) columns of the RFC schema
#: A message's priority: 0 (first) to 255, in a TINYINT UNSIGNED column; the default is
#: the middle-low 50. Here rather than in publishing so that the models, below it, share it.
DEFAULT_PRIORITY = 50
MIN_PRIORITY, MAX_PRIORITY = 0, 255
#: Deepest nesting of lists and objects a payload (or a task's arguments) may have. Python's
#: JSON decoder recurses once per level: payloads nested thousands deep decode in a
#: shallow stack (the publisher's) but not in a deeper one (the admin's, a handler's), so
#: what is accepted stays far below every stack's limit.
MAX_JSON_DEPTH = 100
#: What changes the nesting or the in-string state: one character each, so scanning for
#: them is linear in the text (a pattern for whole strings backtracks quadratically on
#: an unterminated one made of escaped quotes).
_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')
#: Longest text (error, traceback, reason) stored for an outcome: its start and its end
#: are kept, which say where it failed and why.
MAX_STORED_TEXT_CHARS = 64 * 1024
#: What no database column takes: PostgreSQL text and jsonb refuse NUL, and no UTF-8
#: encoder takes a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def json_depth(text: str) -> int:
    """How deep lists and objects nest in the JSON ``text`` (0 for a scalar), in one pass
    over its brackets, quotes and backslashes (linear time whatever the text: brackets
    inside strings do not count)."""
    depth = deepest = 0
    in_string = False
    escaped_at = -1  # the position a backslash inside a string escapes
    for match in _JSON_STRUCTURE.finditer(text):
        position, ch = match.start(), match.group()
        if in_string:
            if position == escaped_at:
                continue
            if ch == "\\":
                escaped_at = position + 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_json_depth(kind: str, text: str) -> str:
    """``text`` if it nests at most ``MAX_JSON_DEPTH`` deep; raises ValueError otherwise."""
    # Counting brackets runs in C: a text with few cannot nest deep (the common case).
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"{kind} nests lists and objects more than {MAX_JSON_DEPTH} deep.")
    return text


def check_name(kind: str, value: Any, max_bytes: int = MAX_NAME_BYTES) -> str:
    """A non-empty str of printable characters, at most ``max_bytes`` in UTF-8; raises
    ValueError naming the problem. Refused, so that no name can pass for another where it
    is shown (the admin, the command line, logs):

    - control characters;
    - invisible ones, which reorder or hide text: format characters such as the
      bidirectional overrides U+202A-202E and U+2066-2069 and the zero-width U+200B-200F,
      and the line and paragraph separators U+2028/2029;
    - blank ones: spaces other than U+0020 (U+00A0 NBSP, U+3000, ...), the Hangul fillers
      U+115F, U+1160, U+3164, U+FFA0, U+2800 BRAILLE PATTERN BLANK, the combining
      grapheme joiner U+034F and the Mongolian and Khmer ignorables, private-use
      characters and noncharacters (U+FDD0-FDEF, U+FFFE, U+FFFF, ...);
    - whitespace at either end (``"orders "`` shows as ``"orders"``);
    - a combining mark at the start or on an ASCII character (U+0336 overlays ``s`` in
      ``"orders\\u0336"``; U+FE0F after ``s`` shows nothing): marks on letters of other
      scripts (Devanagari, Thai, Hebrew points) and an emoji's variation selector stay;
    - a name not in Unicode's composed form NFC (``"cafe\\u0301"`` shows as ``"café"``).
    """
    if not isinstance(value, str):
        raise ValueError(f"{kind} must be a string, not {type(value).__name__}.")
    if not value:
        raise ValueError(f"{kind} must not be empty.")
    if value.isascii() and value.isprintable():
        size = len(value)  # the common case, checked in C: one byte per character
    else:
        bad = next((ch for ch in value if _is_control(ch)), None)
        if bad is not None:
            raise ValueError(f"{kind} {value[:50]!r} contains the control character {bad!r}.")
        _refuse_look_alikes(kind, value)
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"{kind} {value[:50]!r} is not valid Unicode text.") from None
    if value[0].isspace() or value[-1].isspace():
        end = "begins" if value[0].isspace() else "ends"
        raise ValueError(f"{kind} {value[:50]!r} {end} with whitespace, which does not show "
                         "where the name is shown (a look-alike of the name without it).")
    if size > max_bytes:
        raise ValueError(f"{kind} is {size} bytes long; the limit is {max_bytes} bytes.")
    return value


def _refuse_look_alikes(kind: str, value: str) -> None:
    """The characters, and the forms, by which a name shows as another one."""
    bad = next((ch for ch in value if _is_invisible(ch)), None)
    if bad is not None:
        raise ValueError(f"{kind} {value[:50]!r} contains the invisible character "
                         f"U+{ord(bad):04X} ({unicodedata.name(bad, 'unnamed')}), "
                         "which can reorder or hide text where it is shown.")
    bad = next((ch for ch in value if _is_blank(ch)), None)
    if bad is not None:
        raise ValueError(f"{kind} {value[:50]!r} contains the blank or invisible character "
                         f"U+{ord(bad):04X} ({_character_name(bad)}), which shows as a "
                         "space or not at all where the name is shown.")
    if not unicodedata.is_normalized("NFC", value):
        composed = unicodedata.normalize("NFC", value)
        raise ValueError(f"{kind} {value[:50]!r} is not in Unicode's composed form (NFC): it "
                         f"shows as {composed[:50]!r}, another name. Use that one "
                         "(unicodedata.normalize('NFC', name)).")
    for position, ch in enumerate(value):
        if unicodedata.category(ch) in _MARK_CATEGORIES and (
                position == 0 or value[position - 1].isascii()):
            on = "at its start" if position == 0 else f"on {value[position - 1]!r}"
            raise ValueError(f"{kind} {value[:50]!r} contains the combining mark "
                             f"U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}) {on}, "
                             "which makes it look like another name.")


def _character_name(ch: str) -> str:
    name = unicodedata.name(ch, "")
    if name:
        return name
    return "a private-use character" if unicodedata.category(ch) == "Co" else "a noncharacter"


def _is_control(ch: str) -> bool:
    return ord(ch) < 32 or 127 <= ord(ch) < 160


#: Unicode categories shown escaped and refused in names: format characters (Cf: the
#: bidirectional overrides and isolates, zero-width spaces and joiners, U+061C, U+FEFF)
#: and the line and paragraph separators (Zl, Zp).
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})
#: Categories that show blank: spaces (Zs; U+0020 itself is allowed inside a name) and
#: private-use characters (Co: what they show, if anything, depends on the reader's fonts).
_BLANK_CATEGORIES = frozenset({"Zs", "Co"})
#: Characters of other categories that show blank or not at all: the Hangul fillers (Lo),
#: the braille blank (So), and the default-ignorable marks (the combining grapheme joiner,
#: the Khmer inherent vowels, the Mongolian variation selectors and vowel separator).
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5"
                              "\u180b\u180c\u180d\u180e\u180f")
#: Combining marks (nonspacing and enclosing; variation selectors are nonspacing ones)
_MARK_CATEGORIES = frozenset({"Mn", "Me"})


def _is_invisible(ch: str) -> bool:
    return ord(ch) >= 0xA0 and unicodedata.category(ch) in _INVISIBLE_CATEGORIES


def _is_blank(ch: str) -> bool:
    """Shows as a space, or not at all (U+0020 aside). Not every unassigned code point
    (Cn): what is unassigned depends on the Python's Unicode version, and a name one
    process accepts (an emoji of Unicode 15) must not be refused by another (3.11 knows
    Unicode 14); the noncharacters are, in every version."""
    code = ord(ch)
    if code < 0xA0:
        return False
    return (ch in _BLANK_CHARACTERS or unicodedata.category(ch) in _BLANK_CATEGORIES
            or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE)


def escape_controls(text: str) -> str:
    """``text`` for a terminal: every control character (C0, DEL, C1: escape sequences
    that move the cursor, clear the screen or rewrite earlier lines) written as a
    ``\\xNN`` escape, and every invisible or blank one (bidirectional overrides, zero-width
    and other format characters, line and paragraph separators: they reorder or hide what
    is shown; and what ``check_name`` refuses as blank: spaces other than U+0020, the
    Hangul fillers, the braille blank, private-use characters, noncharacters) as
    ``\\uNNNN``, so stored text cannot forge or hide a command's output. Its
    output is left unchanged by a second pass."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    if _is_control(ch):
        return f"\\x{ord(ch):02x}"
    if _is_invisible(ch) or _is_blank(ch):
        return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"
    return ch


def has_unstorable_text(text: str) -> bool:
    """Whether ``text`` holds what no database stores as text: a NUL or a lone surrogate."""
    if text.isascii():
        return "\x00" in text
    return _UNSTORABLE.search(text) is not None


def storable_text(value: object, max_chars: int = MAX_STORED_TEXT_CHARS) -> str:
    """``value`` as text every database stores (guarantee I15): NUL and lone surrogates
    replaced by U+FFFD, at most ``max_chars`` characters (the start and the end kept).
    Never raises: a value whose ``str()`` raises is described by its type."""
    if type(value) is not str:
        try:
            value = str(value)
        except Exception:  # a hostile __str__, a RecursionError: still an outcome
            return f"<{_type_name(value)} whose str() failed>"
    text = str.__str__(value)
    if len(text) > max_chars:
        marker = "\n[... truncated ...]\n"
        half = (max_chars - len(marker)) // 2
        text = text[:half] + marker + text[len(text) - half:]
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def _type_name(value: object) -> str:
    try:
        return type(value).__qualname__
    except Exception:
        return "object"


#: Query parameters of a URL that carry a secret (Redis takes ``?password=``).
_SECRET_PARAMETERS = ("password", "passwd", "pass", "token", "secret", "key")


def url_has_secret(url: str) -> bool:
    """Whether ``url`` carries a password: in its authority (read as ``redacted_url``
    reads it: up to the last ``@``) or as a secret query parameter."""
    _, separator, rest = url.partition("://")
    if not separator:
        return False
    userinfo = rest.rpartition("@")[0]
    if ":" in userinfo:
        return True
    query = rest.rpartition("@")[2].partition("?")[2]
    return any(pair.partition("=")[0].lower() in _SECRET_PARAMETERS
               for pair in query.split("&"))


def redacted_url(url: str) -> str:
    """``url`` fit for a log line or an error: the password (in the authority or in the
    query) replaced by ``***``; the scheme, user, host, port, path (Redis's database) and
    other parameters kept. Read by hand rather than by ``urlsplit``: a password holding
    an unencoded ``/``, ``?`` or ``#`` would end the authority early and be shown as
    the path. Everything up to the last ``@`` is credentials; showing less is safe."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return "<a URL>" if "@" in url or "password" in url.lower() else url
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        rest = (f"{user}:***@" if colon and user else "***@") + rest
    location, question, query = rest.partition("?")
    if question:
        query = "&".join(
            f"{key}=***" if key.lower() in _SECRET_PARAMETERS else pair
            for pair in query.split("&") for key in [pair.partition("=")[0]])
    return f"{scheme}://{location}{question}{query}"


#: where a URL parser may cut a password that holds them unencoded
_URL_DELIMITERS = re.compile(r"[/?#@:]")
#: a part of a password shorter than this is not searched for in an error's text (it
#: would match by chance): if one occurs there anyway, the text is not shown at all
_SHORTEST_SCRUBBED = 4


def without_secrets(text: str, url: str) -> str:
    """``text`` (an error about ``url``, say redis-py's) with no part of the URL's secrets:
    the password (read as ``redacted_url`` reads it), each piece of it a parser may have
    cut at an unencoded ``/``, ``?``, ``#``, ``@`` or ``:``, and the values of secret query
    parameters, replaced by ``***``. When a piece too short to be replaced safely occurs in
    it, none of the text is shown."""
    secrets = _url_secrets(url)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _SHORTEST_SCRUBBED:
            text = text.replace(secret, "***")
    if any(secret in text for secret in secrets if len(secret) < _SHORTEST_SCRUBBED):
        return "<not shown: it may quote part of the URL's password>"
    return text


def _url_secrets(url: str) -> set[str]:
    _, separator, rest = url.partition("://")
    if not separator:
        return set()
    secrets: set[str] = set()
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        password = userinfo.partition(":")[2]
        secrets |= {password, *_URL_DELIMITERS.split(password)}
    query = rest.partition("?")[2]
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key.lower() in _SECRET_PARAMETERS:
            secrets |= {value, *_URL_DELIMITERS.split(value)}
    return {secret for secret in secrets if secret}


#: the partition keys of messages published without one: this prefix and a number
UNKEYED_PREFIX = "default-"


def unkeyed_partition(message_id: str, partitions: int) -> str:
    """Spread unkeyed messages over ``partitions`` keys, deterministically by id.

    Deterministic so that publishing the same id twice (a retried job, a Spark task
    retry) lands on the same key and is deduplicated; ``send_message`` and the Spark
    writer share it."""
    return f"{UNKEYED_PREFIX}{zlib.crc32(message_id.encode('utf-8')) % partitions}"
