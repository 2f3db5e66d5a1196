"""The ``SQLQUEUE`` setting: defaults, validation and a lazily built, typed view of it.

Nothing here reads Django settings at import time. ``get_settings()`` builds a frozen
``QueueSettings`` on first use and caches it until Django's ``setting_changed`` signal
says ``SQLQUEUE`` (or ``DATABASES``) changed, so ``override_settings`` works in tests.

``validate()`` is shared by the system checks (``sqlqueue.checks``) and by
``get_settings()``: the checks report every problem with a stable id, and runtime code
refuses to start on settings the checks would reject. Each value's own check and
coercion is in ``sqlqueue.setting_converters``; the checks across settings are here.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from sqlqueue.exceptions import ConfigurationError
from sqlqueue.naming import MAX_NAME_BYTES as MAX_NAME_BYTES  # re-exported
from sqlqueue.naming import redacted_url
from sqlqueue.setting_converters import CONVERTERS, BadValue

#: the upper bounds (seconds) of the handler duration histogram's buckets, shared by
#: ``sqlqueue_handler_duration_seconds`` (/metrics) and the admin's per-minute rollup
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

@dataclass(frozen=True)
class QueueSettings:
    """Validated ``SQLQUEUE`` values; durations are float seconds."""

    DATABASE: str = "default"
    POLL_INTERVAL: float = 0.1
    BATCH_SIZE: int = 10
    VISIBILITY_TIMEOUT: float = 60.0
    MAX_ATTEMPTS: int = 5
    MIN_BACKOFF: float = 1.0
    MAX_BACKOFF: float = 3600.0
    LEASE_DURATION: float = 30.0
    LEASE_RENEW_INTERVAL: float = 10.0
    THREADS: int = 4
    SHUTDOWN_TIMEOUT: float = 30.0
    DEFAULT_PARTITIONS: int = 16
    MAX_PAYLOAD_BYTES: int = 1_048_576
    DLQ_SUFFIX: str = "_dlq"
    RETENTION: float = 0.0
    MAX_TRANSACTION_AGE: float = 300.0
    KEEP_DELIVERY_STATE: bool = False
    IDEMPOTENCY_WINDOW: float = 86400.0
    #: a Bearer token that may read ``metrics/`` ("" : only logged-in users may)
    METRICS_TOKEN: str = ""
    #: (topic pattern, database alias) pairs, in the order written (``SQLQUEUE["ROUTES"]``)
    ROUTES: tuple[tuple[str, str], ...] = ()
    #: (database alias, replica alias) pairs (``SQLQUEUE["READ_REPLICAS"]``): the admin's
    #: lag and subscriber pages read the replica of a database instead of it
    READ_REPLICAS: tuple[tuple[str, str], ...] = ()
    #: (name, entry) pairs of ``SQLQUEUE["SCHEDULES"]``; the entries are parsed and
    #: checked by ``sqlqueue.scheduling`` (check ids sqlqueue.E3xx)
    SCHEDULES: tuple[tuple[str, Any], ...] = ()
    #: topic patterns (``fnmatch``) a schedule stored in the database may publish to
    #: (``SQLQUEUE["SCHEDULE_TOPICS"]``); a Tasks backend's topics are refused whatever
    #: they say (sqlqueue.scheduling.stored)
    SCHEDULE_TOPICS: tuple[str, ...] = ("*",)
    #: a committed publish wakes the runners consuming its topic (sqlqueue.wakeups)
    WAKEUPS: bool = True
    #: (queue alias, alias the PostgreSQL listener connects through) pairs
    #: (``SQLQUEUE["WAKEUP_LISTEN_DATABASES"]``): a session-mode address behind PgBouncer
    WAKEUP_LISTEN_DATABASES: tuple[tuple[str, str], ...] = ()
    #: a Redis URL: wake-ups between processes through Redis pub/sub ("": none)
    WAKEUP_REDIS_URL: str = ""
    #: PostgreSQL: a connection that publishes often runs ``send_message``'s INSERT as a
    #: statement prepared in its session, unless it goes through a pooler
    #: (sqlqueue.storage.sql.prepared)
    PREPARED_PUBLISH: bool = True

    def listen_alias_for(self, alias: str) -> str:
        """The database alias the PostgreSQL wake-up listener of ``alias`` connects
        through (``WAKEUP_LISTEN_DATABASES``; ``alias`` itself by default)."""
        return dict(self.WAKEUP_LISTEN_DATABASES).get(alias, alias)

    def has_listen_alias(self, alias: str) -> bool:
        """Do the settings name the listener's alias for ``alias`` (perhaps ``alias``
        itself, behind a session-mode pool)? Then the listener trusts a pooler there."""
        return alias in dict(self.WAKEUP_LISTEN_DATABASES)

    def alias_for(self, topic: str) -> str:
        """The database a topic's messages live in: the first route whose pattern
        (``fnmatch``: ``*``, ``?``, ``[...]``) matches it, else ``DATABASE``."""
        for pattern, alias in self.ROUTES:
            if fnmatch.fnmatchcase(topic, pattern):
                return alias
        return self.DATABASE

    def allows_schedule_topic(self, topic: str) -> bool:
        """Whether a stored schedule may publish to ``topic``: a pattern of
        ``SCHEDULE_TOPICS`` matches it (``fnmatch``, case-sensitive)."""
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.SCHEDULE_TOPICS)

    def read_alias(self, alias: str) -> str:
        """Where the admin's pages read ``alias``'s queue tables: its replica if
        ``READ_REPLICAS`` names one (repairs always write to ``alias`` itself)."""
        return dict(self.READ_REPLICAS).get(alias, alias)

    @property
    def databases(self) -> tuple[str, ...]:
        """Every alias the queue lives in: ``DATABASE``, then each alias a route names,
        in the order written. Monitoring (metrics, ``queue health``, ``queue status``)
        reads them all."""
        return tuple(dict.fromkeys([self.DATABASE, *(alias for _, alias in self.ROUTES)]))

    @property
    def max_topic_bytes(self) -> int:
        """Longest topic (UTF-8 bytes) whose dead-letter topic still fits 255 bytes."""
        return MAX_NAME_BYTES - len(self.DLQ_SUFFIX.encode("utf-8"))


DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(QueueSettings)}
DEFAULTS["SCHEDULES"] = {}  # written as a dict, kept as pairs (a frozen, hashable value)
DEFAULTS["WAKEUP_LISTEN_DATABASES"] = {}  # the same
DEFAULTS["SCHEDULE_TOPICS"] = ["*"]  # written as a list, kept as a tuple


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings; ``id`` is the system check id (``sqlqueue.E004``)."""

    id: str
    msg: str
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return ".E" in self.id


assert set(CONVERTERS) == set(DEFAULTS), "every setting needs exactly one converter"


# -- validation -------------------------------------------------------------------------

def validate(
    raw: Any, database_aliases: Mapping[str, Any] | None = None
) -> tuple[QueueSettings | None, list[Problem]]:
    """Check a raw ``SQLQUEUE`` value; return the settings (if usable) and every problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return None, [Problem(
            "sqlqueue.E001",
            f"SQLQUEUE must be a dict, not {type(raw).__name__}.",
            "Set SQLQUEUE = {...} in your settings, or remove it to use the defaults.",
        )]

    problems: list[Problem] = []
    for key in sorted(set(raw) - set(DEFAULTS), key=str):
        problems.append(Problem(
            "sqlqueue.E002",
            f"SQLQUEUE has an unknown key {key!r}.",
            f"Known keys: {', '.join(DEFAULTS)}.",
        ))

    values: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = raw.get(key, default)
        try:
            values[key] = CONVERTERS[key](value)
        except BadValue as bad:
            # A URL can carry a password: an error shows it redacted.
            shown = redacted_url(value) if key.endswith("_URL") and isinstance(value, str) \
                else value
            problems.append(Problem(
                bad.check_id,
                f"SQLQUEUE[{key!r}] {bad.reason}; got {shown!r}.",
                f"The default is {default!r}.",
            ))

    problems.extend(_relations(values, database_aliases))
    if any(p.is_error for p in problems):
        return None, problems
    return QueueSettings(**values), problems


def _relations(values: dict[str, Any], aliases: Mapping[str, Any] | None) -> list[Problem]:
    problems: list[Problem] = []
    renew, lease = values.get("LEASE_RENEW_INTERVAL"), values.get("LEASE_DURATION")
    if renew is not None and lease is not None:
        if renew >= lease:
            problems.append(Problem(
                "sqlqueue.E005",
                f"SQLQUEUE['LEASE_RENEW_INTERVAL'] ({renew:g}s) must be shorter than "
                f"SQLQUEUE['LEASE_DURATION'] ({lease:g}s), or leases expire between renewals.",
                "Keep the renew interval at a third of the lease duration or less.",
            ))
        elif renew > lease / 2:
            problems.append(Problem(
                "sqlqueue.W001",
                f"SQLQUEUE['LEASE_RENEW_INTERVAL'] ({renew:g}s) is more than half of "
                f"SQLQUEUE['LEASE_DURATION'] ({lease:g}s): one slow renewal loses the lease.",
                "Keep the renew interval at a third of the lease duration or less.",
            ))
    low, high = values.get("MIN_BACKOFF"), values.get("MAX_BACKOFF")
    if low is not None and high is not None and low > high:
        problems.append(Problem(
            "sqlqueue.E006",
            f"SQLQUEUE['MIN_BACKOFF'] ({low:g}s) is greater than "
            f"SQLQUEUE['MAX_BACKOFF'] ({high:g}s).",
        ))
    alias = values.get("DATABASE")
    if alias is not None and aliases is not None and alias not in aliases:
        problems.append(Problem(
            "sqlqueue.E007",
            f"SQLQUEUE['DATABASE'] is {alias!r}, which is not in DATABASES.",
            f"Use one of: {', '.join(aliases) or '(none configured)'}.",
        ))
    for pattern, routed in values.get("ROUTES") or ():
        if aliases is not None and routed not in aliases:
            problems.append(Problem(
                "sqlqueue.E007",
                f"SQLQUEUE['ROUTES'] sends topics {pattern!r} to {routed!r}, which is not in "
                "DATABASES.",
                f"Use one of: {', '.join(aliases) or '(none configured)'}.",
            ))
    problems.extend(_missing_alias_problems("READ_REPLICAS", values, aliases))
    problems.extend(_listen_database_problems(values, aliases))
    poll, visibility = values.get("POLL_INTERVAL"), values.get("VISIBILITY_TIMEOUT")
    if poll is not None and visibility is not None and poll >= visibility:
        problems.append(Problem(
            "sqlqueue.W002",
            f"SQLQUEUE['POLL_INTERVAL'] ({poll:g}s) is not shorter than "
            f"SQLQUEUE['VISIBILITY_TIMEOUT'] ({visibility:g}s): redeliveries will lag.",
        ))
    return problems


def _missing_alias_problems(setting: str, values: dict[str, Any],
                            aliases: Mapping[str, Any] | None) -> list[Problem]:
    """E007 for each pair of an alias-pairs setting that names an alias not in
    ``DATABASES``."""
    problems: list[Problem] = []
    for pair in values.get(setting) or ():
        missing = [a for a in pair if aliases is not None and a not in aliases]
        if missing:
            problems.append(Problem(
                "sqlqueue.E007",
                f"SQLQUEUE[{setting!r}] names {', '.join(map(repr, missing))}, which is not "
                "in DATABASES.",
                f"Use one of: {', '.join(aliases or {}) or '(none configured)'}.",
            ))
    return problems


def _listen_database_problems(values: dict[str, Any],
                              aliases: Mapping[str, Any] | None) -> list[Problem]:
    """Both sides of each ``WAKEUP_LISTEN_DATABASES`` pair are aliases of ``DATABASES``
    (E007), and the listener's is a PostgreSQL database (E009: LISTEN is PostgreSQL's)."""
    problems = _missing_alias_problems("WAKEUP_LISTEN_DATABASES", values, aliases)
    if aliases is None:
        return problems
    for queue_alias, listen_alias in values.get("WAKEUP_LISTEN_DATABASES") or ():
        if queue_alias not in aliases or listen_alias not in aliases:
            continue  # E007 above
        engine = str((aliases[listen_alias] or {}).get("ENGINE", ""))
        if "postgresql" not in engine:
            problems.append(Problem(
                "sqlqueue.E009",
                f"SQLQUEUE['WAKEUP_LISTEN_DATABASES'] sends the wake-up listener of "
                f"{queue_alias!r} through {listen_alias!r}, which is not a PostgreSQL "
                f"database ({engine or 'no ENGINE'}).",
                "LISTEN is PostgreSQL's: name an alias of the same PostgreSQL database "
                "(a session-mode address behind PgBouncer).",
            ))
    return problems


# -- the cached, lazily built settings ---------------------------------------------------

_cached: QueueSettings | None = None


def get_settings() -> QueueSettings:
    """The validated settings; raises ``ConfigurationError`` naming every error."""
    global _cached
    if _cached is None:
        from django.conf import settings as django_settings

        built, problems = validate(
            getattr(django_settings, "SQLQUEUE", None), django_settings.DATABASES
        )
        if built is None:
            details = "; ".join(f"{p.msg} ({p.id})" for p in problems if p.is_error)
            raise ConfigurationError(f"Invalid SQLQUEUE setting: {details}")
        _cached = built
    return _cached


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting in ("SQLQUEUE", "DATABASES"):
        _cached = None
