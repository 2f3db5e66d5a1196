"""Converters of ``SQLQUEUE`` values: each checks one raw value and returns it coerced
(durations to float seconds, dicts to ordered pairs), or raises ``BadValue`` with the
system check id to report.

``CONVERTERS`` maps every setting to its converter; ``sqlqueue.conf.validate()`` applies
them, and consumer and task options (``sqlqueue.consuming.registry``,
``sqlqueue.integrations.tasks.options``) reuse them for their per-consumer overrides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlqueue.exceptions import SqlqueueError

MAX_DLQ_SUFFIX_BYTES = 64
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")


class BadValue(SqlqueueError):
    """A setting's value that cannot be used: the check id to report and why."""

    def __init__(self, check_id: str, reason: str) -> None:
        super().__init__(reason)
        self.check_id = check_id
        self.reason = reason


def _seconds(value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue("sqlqueue.E003", "must be a number of seconds or a timedelta")
    if not math.isfinite(value):
        raise BadValue("sqlqueue.E004", "must be finite")
    return float(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue("sqlqueue.E003", "must be an integer")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadValue("sqlqueue.E003", "must be True or False")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue("sqlqueue.E003", "must be a string")
    return value


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _at_least(
    convert: Callable[[Any], Any], minimum: float, *, strict: bool = False
) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        converted = convert(value)
        if converted < minimum or (strict and converted == minimum):
            relation = ">" if strict else ">="
            raise BadValue("sqlqueue.E004", f"must be {relation} {_number(minimum)}")
        return converted

    return check


def _at_most(check: Callable[[Any], Any], maximum: float) -> Callable[[Any], Any]:
    def bounded(value: Any) -> Any:
        converted = check(value)
        if converted > maximum:
            raise BadValue("sqlqueue.E004", f"must be <= {_number(maximum)}")
        return converted

    return bounded


def _dlq_suffix(value: Any) -> str:
    text = _text(value)
    if not text:
        raise BadValue("sqlqueue.E004", "must not be empty")
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in text):
        raise BadValue("sqlqueue.E004", "must not contain control characters")
    if len(text.encode("utf-8")) > MAX_DLQ_SUFFIX_BYTES:
        raise BadValue("sqlqueue.E004", f"must be at most {MAX_DLQ_SUFFIX_BYTES} bytes")
    return text


def _string_pairs(meaning: str, example: str, keys: str = "aliases",
                  values: str = "aliases") -> Callable[[Any], tuple[tuple[str, str], ...]]:
    """A converter of a dict of non-empty strings to non-empty strings, kept as pairs in
    the order written (ROUTES, READ_REPLICAS, WAKEUP_LISTEN_DATABASES)."""
    def convert(value: Any) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, Mapping | tuple):
            raise BadValue("sqlqueue.E003", f"must be a dict of {meaning}, such as {example}")
        pairs = tuple(value.items()) if isinstance(value, Mapping) else tuple(value)
        for pair in pairs:
            if (not isinstance(pair, tuple) or len(pair) != 2
                    or not all(isinstance(part, str) and part for part in pair)):
                raise BadValue("sqlqueue.E004",
                                f"must map non-empty {keys} to non-empty {values}")
        return pairs

    return convert


_routes = _string_pairs("topic patterns to database aliases", '{"orders.*": "orders_db"}',
                        keys="topic patterns", values="database aliases")
_replicas = _string_pairs("database aliases to their replicas' aliases",
                         '{"default": "replica"}')
_listen_databases = _string_pairs(
    "queue database aliases to the aliases their wake-up listener connects through",
    '{"default": "listen"}')


def _redis_url(value: Any) -> str:
    text = _text(value)
    if text and not text.startswith(REDIS_URL_SCHEMES):
        raise BadValue("sqlqueue.E008",
                        f"must be empty or a Redis URL ({', '.join(REDIS_URL_SCHEMES)}...)")
    if text and "@" not in urlsplit(text).netloc and "@" in text.partition("://")[2]:
        # A '/', '?' or '#' left raw in the password ends the host part early: redis-py
        # would take the rest for the port or the path, and quote the password's first
        # part in its error (as the Spark URL parser, sqlqueue.integrations.spark.connect).
        raise BadValue("sqlqueue.E008",
                       "has a '/', '?' or '#' before its last '@' (in its user or password): "
                       "percent-encode them (%2F, %3F, %23; an '@' in a password as %40)")
    return text


def _schedules(value: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(value, Mapping):
        raise BadValue("sqlqueue.E301", "must be a dict of schedule name to schedule")
    return tuple(value.items())


def _topic_patterns(value: Any) -> tuple[str, ...]:
    """A list of non-empty ``fnmatch`` patterns (``SCHEDULE_TOPICS``). A lone string is
    refused rather than read as a list of its characters."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise BadValue("sqlqueue.E003", 'must be a list of topic patterns, such as '
                                        '["reports.*", "maintenance"]')
    if not all(isinstance(pattern, str) and pattern for pattern in value):
        raise BadValue("sqlqueue.E004", "must hold non-empty strings (fnmatch patterns)")
    return tuple(value)


def _alias(value: Any) -> str:
    text = _text(value)
    if not text:
        raise BadValue("sqlqueue.E004", "must not be empty")
    return text


_positive_seconds = _at_least(_seconds, 0, strict=True)
_non_negative_seconds = _at_least(_seconds, 0)

CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "DATABASE": _alias,
    "POLL_INTERVAL": _positive_seconds,
    "BATCH_SIZE": _at_most(_at_least(_integer, 1), 10_000),
    "VISIBILITY_TIMEOUT": _positive_seconds,
    "MAX_ATTEMPTS": _at_most(_at_least(_integer, 1), 1_000_000),
    "MIN_BACKOFF": _non_negative_seconds,
    "MAX_BACKOFF": _positive_seconds,
    "LEASE_DURATION": _positive_seconds,
    "LEASE_RENEW_INTERVAL": _positive_seconds,
    "THREADS": _at_most(_at_least(_integer, 1), 1024),
    "SHUTDOWN_TIMEOUT": _non_negative_seconds,
    "DEFAULT_PARTITIONS": _at_most(_at_least(_integer, 1), 100_000),
    "MAX_PAYLOAD_BYTES": _at_most(_at_least(_integer, 1), 1 << 30),
    "DLQ_SUFFIX": _dlq_suffix,
    "RETENTION": _non_negative_seconds,
    "MAX_TRANSACTION_AGE": _positive_seconds,
    "KEEP_DELIVERY_STATE": _boolean,
    "IDEMPOTENCY_WINDOW": _non_negative_seconds,
    "ROUTES": _routes,
    "READ_REPLICAS": _replicas,
    "SCHEDULES": _schedules,
    "SCHEDULE_TOPICS": _topic_patterns,
    "METRICS_TOKEN": _text,
    "WAKEUPS": _boolean,
    "PREPARED_PUBLISH": _boolean,
    "WAKEUP_LISTEN_DATABASES": _listen_databases,
    "WAKEUP_REDIS_URL": _redis_url,
}
