"""``@sqlqueue.consumer``: registering handlers, and finding them in ``consumers.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlqueue.conf import QueueSettings
from sqlqueue.exceptions import ConfigurationError
from sqlqueue.naming import check_name
from sqlqueue.setting_converters import CONVERTERS, BadValue

Handler = Callable[..., Any]

#: consumer option -> the SQLQUEUE key that gives its default
OPTION_SETTINGS = {
    "max_attempts": "MAX_ATTEMPTS",
    "visibility_timeout": "VISIBILITY_TIMEOUT",
    "batch_size": "BATCH_SIZE",
    "min_backoff": "MIN_BACKOFF",
    "max_backoff": "MAX_BACKOFF",
}


@dataclass(frozen=True)
class ConsumerOptions:
    """A consumer's options with the settings' defaults filled in."""

    max_attempts: int
    visibility_timeout: float
    batch_size: int
    min_backoff: float
    max_backoff: float


@dataclass(frozen=True)
class Consumer:
    """A registered handler of one topic for one consumer group."""

    topic: str
    group: str
    handler: Handler
    ordered: bool = False
    atomic: bool = False
    overrides: tuple[tuple[str, Any], ...] = ()
    #: seconds a handler call may take before it counts as failed (None: no limit)
    timeout: float | None = None
    #: messages started per second by the whole group, all processes (None: no limit)
    rate_limit: float | None = None
    #: deliveries outstanding at once in the whole group, all processes (None: no limit)
    max_in_flight: int | None = None
    #: where a group that has no position on the topic yet starts: "earliest" (the oldest
    #: message still kept) or "latest" (only messages published after it first runs)
    start: str = "earliest"
    #: a batch consumer (``@batch_consumer``): the most messages per handler call (None: a
    #: consumer of one message per call)
    max_batch: int | None = None
    #: a batch consumer: seconds a runner may hold a batch that is not full to fill it
    max_wait: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.group}:{self.topic}"

    @property
    def batched(self) -> bool:
        """Its handler takes a list of messages (``@batch_consumer``)."""
        return self.max_batch is not None

    def options(self, conf: QueueSettings) -> ConsumerOptions:
        values = {option: getattr(conf, key) for option, key in OPTION_SETTINGS.items()}
        if self.max_batch is not None:
            # The buffer a partition reads ahead holds two batches: the next one is ready
            # when a handler thread finishes the last.
            values["batch_size"] = max(values["batch_size"], 2 * self.max_batch)
        values.update(dict(self.overrides))
        if values["min_backoff"] > values["max_backoff"]:
            raise ConfigurationError(
                f"Consumer {self.name}: min_backoff ({values['min_backoff']:g}s) is greater "
                f"than max_backoff ({values['max_backoff']:g}s)."
            )
        return ConsumerOptions(**values)


_registry: dict[tuple[str, str], Consumer] = {}
#: the values of @consumer(start=...)
START_POSITIONS = ("earliest", "latest")
#: the most messages a ``@batch_consumer`` handler may take per call (its ``max_batch``):
#: each batch's marks and acks are one statement, whose size this keeps within what every
#: database accepts
MAX_BATCH_LIMIT = 10_000
#: the longest ``@batch_consumer(max_wait=...)``, in seconds: a batch held to fill is
#: delivered already (its visibility timeout runs)
MAX_WAIT_LIMIT = 60.0


def consumer(
    topic: str,
    *,
    group: str,
    ordered: bool = False,
    atomic: bool = False,
    max_attempts: int | None = None,
    visibility_timeout: float | None = None,
    batch_size: int | None = None,
    min_backoff: float | None = None,
    max_backoff: float | None = None,
    timeout: float | None = None,
    rate_limit: float | None = None,
    max_in_flight: int | None = None,
    start: str = "earliest",
) -> Callable[[Handler], Handler]:
    """Register the decorated function as ``group``'s handler of ``topic``.

    Options left as None take their value from ``SQLQUEUE`` when the consumer runs.
    ``rate_limit`` and ``max_in_flight`` hold for the whole group, across processes
    (sqlqueue.consuming.limits). ``start`` places a group that has no position on the
    topic yet: ``"earliest"``, every message still kept, or ``"latest"``, only messages
    published after it first runs (docs/guides/consuming.md, "Where a new group starts").
    """
    return _register("@consumer", topic, group=group, ordered=ordered, atomic=atomic,
                     given={"max_attempts": max_attempts,
                            "visibility_timeout": visibility_timeout,
                            "batch_size": batch_size, "min_backoff": min_backoff,
                            "max_backoff": max_backoff},
                     timeout=timeout, rate_limit=rate_limit, max_in_flight=max_in_flight,
                     start=start)


def batch_consumer(
    topic: str,
    *,
    group: str,
    max_batch: int = 100,
    max_wait: float = 0,
    ordered: bool = False,
    atomic: bool = False,
    max_attempts: int | None = None,
    visibility_timeout: float | None = None,
    batch_size: int | None = None,
    min_backoff: float | None = None,
    max_backoff: float | None = None,
    timeout: float | None = None,
    rate_limit: float | None = None,
    max_in_flight: int | None = None,
    start: str = "earliest",
) -> Callable[[Handler], Handler]:
    """Register the decorated function as ``group``'s handler of ``topic``, called with a
    ``list[Message]`` of up to ``max_batch`` messages (docs/guides/consuming.md, "Batch
    consumers"). It returns None (every message acked) or a mapping from some of them to
    the exception each fails with (the others acked); raising fails every message.
    ``max_wait``: seconds a runner may hold a batch that is not full to fill it (0: what is
    deliverable now). The other options are ``@consumer``'s; ``timeout`` is the whole
    call's, ``rate_limit`` and ``max_in_flight`` count messages."""
    where = f"@batch_consumer({topic!r}, group={group!r})"
    if (isinstance(max_batch, bool) or not isinstance(max_batch, int)
            or not 1 <= max_batch <= MAX_BATCH_LIMIT):
        raise ConfigurationError(f"{where}: max_batch is a whole number of messages from 1 "
                                 f"to {MAX_BATCH_LIMIT:,}; got {max_batch!r}.")
    if (isinstance(max_wait, bool) or not isinstance(max_wait, int | float)
            or not 0 <= max_wait <= MAX_WAIT_LIMIT):
        raise ConfigurationError(f"{where}: max_wait is a number of seconds from 0 to "
                                 f"{MAX_WAIT_LIMIT:g}; got {max_wait!r}.")
    return _register("@batch_consumer", topic, group=group, ordered=ordered, atomic=atomic,
                     given={"max_attempts": max_attempts,
                            "visibility_timeout": visibility_timeout,
                            "batch_size": batch_size, "min_backoff": min_backoff,
                            "max_backoff": max_backoff},
                     timeout=timeout, rate_limit=rate_limit, max_in_flight=max_in_flight,
                     start=start, max_batch=max_batch, max_wait=float(max_wait))


def _register(decorator: str, topic: str, *, group: str, ordered: bool, atomic: bool,
              given: dict[str, Any], timeout: float | None, rate_limit: float | None,
              max_in_flight: int | None, start: str, max_batch: int | None = None,
              max_wait: float = 0.0) -> Callable[[Handler], Handler]:
    """Validate a decorator's options (``ConfigurationError`` naming the first bad one)
    and return the function that registers its handler."""
    try:
        check_name("topic", topic)
        check_name("group", group)
    except ValueError as exc:
        raise ConfigurationError(f"{decorator}({topic!r}, group={group!r}): {exc}") from exc
    for flag, value in (("ordered", ordered), ("atomic", atomic)):
        if not isinstance(value, bool):
            raise ConfigurationError(f"{decorator}({topic!r}): {flag} must be True or False.")
    where = f"{decorator}({topic!r}, group={group!r})"
    if timeout is not None and not _positive_number(timeout):
        raise ConfigurationError(f"{where}: timeout is a positive number of seconds; "
                                 f"got {timeout!r}.")
    if rate_limit is not None and not _positive_number(rate_limit):
        raise ConfigurationError(f"{where}: rate_limit is a positive number of messages "
                                 f"per second; got {rate_limit!r}.")
    if max_in_flight is not None and (isinstance(max_in_flight, bool)
                                      or not isinstance(max_in_flight, int)
                                      or max_in_flight < 1):
        raise ConfigurationError(f"{where}: max_in_flight is a whole number of messages, "
                                 f"at least 1; got {max_in_flight!r}.")
    if start not in START_POSITIONS:
        raise ConfigurationError(f"{where}: start is 'earliest' or 'latest'; got {start!r}.")
    overrides: list[tuple[str, Any]] = []
    for option, value in given.items():
        if value is None:
            continue
        try:
            overrides.append((option, CONVERTERS[OPTION_SETTINGS[option]](value)))
        except BadValue as bad:
            raise ConfigurationError(
                f"{where}: {option} {bad.reason}; got {value!r}."
            ) from None

    def register(handler: Handler) -> Handler:
        if not callable(handler):
            raise ConfigurationError(f"{decorator}({topic!r}) must decorate a function.")
        registered = Consumer(topic, group, handler, ordered, atomic, tuple(overrides),
                              timeout=None if timeout is None else float(timeout),
                              rate_limit=None if rate_limit is None else float(rate_limit),
                              max_in_flight=max_in_flight, start=start,
                              max_batch=max_batch, max_wait=max_wait)
        existing = _registry.get((group, topic))
        if existing is not None and _qualified(existing.handler) != _qualified(handler):
            raise ConfigurationError(
                f"Group {group!r} already has a handler for {topic!r}: "
                f"{_qualified(existing.handler)}; one handler per (group, topic)."
            )
        _registry[(group, topic)] = registered
        return handler

    return register


def _positive_number(value: object) -> bool:
    """A finite number above zero (True and False are not numbers here)."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and 0 < value < float("inf"))


def _qualified(handler: Handler) -> str:
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def registered_consumers() -> list[Consumer]:
    return sorted(_registry.values(), key=lambda c: (c.group, c.topic))


def select_consumers(
    groups: Iterable[str] = (), topics: Iterable[str] = ()
) -> list[Consumer]:
    """The registered consumers matching ``groups`` and ``topics`` (empty: all).

    Raises ``ConfigurationError`` naming any group or topic no consumer has.
    """
    wanted_groups, wanted_topics = set(groups), set(topics)
    known = registered_consumers()
    if not known:
        raise ConfigurationError(nothing_registered())
    unknown_groups = wanted_groups - {c.group for c in known}
    unknown_topics = wanted_topics - {c.topic for c in known}
    if unknown_groups or unknown_topics:
        parts = []
        if unknown_groups:
            parts.append(f"no consumer in group(s) {', '.join(sorted(unknown_groups))}")
        if unknown_topics:
            parts.append(f"no consumer of topic(s) {', '.join(sorted(unknown_topics))}")
        available = ", ".join(c.name for c in known)
        raise ConfigurationError(f"{'; '.join(parts)}. Registered (group:topic): {available}.")
    chosen = [
        c for c in known
        if (not wanted_groups or c.group in wanted_groups)
        and (not wanted_topics or c.topic in wanted_topics)
    ]
    if not chosen:
        raise ConfigurationError(
            f"No registered consumer is in group(s) {', '.join(sorted(wanted_groups))} "
            f"and of topic(s) {', '.join(sorted(wanted_topics))}. Registered "
            f"(group:topic): {', '.join(c.name for c in known)}.")
    return chosen


def nothing_registered() -> str:
    """Where consumers are looked for, for the newcomer whose ``runconsumer`` found none
    (docs/guides/consuming.md, "runconsumer"): the module each installed app may have, and the
    decorator that registers a handler there."""
    from django.apps import apps

    searched = [config.name for config in apps.get_app_configs()
                if not config.name.startswith("django.")]
    return ("No consumer is registered. runconsumer imports the module consumers.py of "
            "each installed app (<app>/consumers.py; looked for in: "
            f"{', '.join(searched) or 'no app outside django.contrib'}) and runs the "
            "handlers registered there with @sqlqueue.consumer(\"<topic>\", group=\"<group>\"). "
            "Add the app that has one to INSTALLED_APPS, or write one.")


def unregister(group: str, topic: str) -> None:
    """Forget a consumer (for tests that register handlers on the fly)."""
    _registry.pop((group, topic), None)


def autodiscover() -> None:
    """Import ``consumers`` from every installed app, which registers their handlers."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("consumers")


def refuse_routed_elsewhere(consumers: Sequence[Consumer], conf: QueueSettings) -> None:
    """A consumer whose topic SQLQUEUE["ROUTES"] sends to another database would wait on
    an empty table here: say so instead."""
    elsewhere = sorted({(c.topic, conf.alias_for(c.topic)) for c in consumers
                        if conf.alias_for(c.topic) != conf.DATABASE})
    if elsewhere:
        listed = ", ".join(f"{topic} -> {alias}" for topic, alias in elsewhere)
        raise ConfigurationError(
            f"these topics are routed to another database than {conf.DATABASE!r} "
            f"(SQLQUEUE['ROUTES']): {listed}. Run 'runconsumer --database ALIAS' for each "
            "database, selecting its consumers with --group/--topic.")


def groups_known_here(consumers: Sequence[Consumer]) -> dict[str, set[str]]:
    """By topic of ``consumers``: every group registered in this process for it, running
    here or not (what garbage collection keeps messages for, besides the groups with an
    offsets row anywhere)."""
    known: dict[str, set[str]] = {consumer.topic: set() for consumer in consumers}
    for registered in (*registered_consumers(), *consumers):
        if registered.topic in known:
            known[registered.topic].add(registered.group)
    return known
