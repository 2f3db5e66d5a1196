"""The exception hierarchy. Every error sqlqueue raises derives from SqlqueueError
(tests/unit/test_exceptions_root.py checks every class the package defines).

The root imports no Django, so that the Spark data source's executors, which must not
load Django, raise errors of the same root. ``ConfigurationError`` is also Django's
``ImproperlyConfigured``: it (and ``NotMigrated``) is made on first use, when Django is
imported by whoever asks for it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any


class SqlqueueError(Exception):
    """Root of every exception raised by sqlqueue."""


class InvalidMessage(SqlqueueError, ValueError):
    """A message was refused before anything was written.

    Raised for bad topics, partition keys, ids, payloads, metadata, priorities and
    schedules. The caller's transaction is untouched and stays usable.
    """


if TYPE_CHECKING:
    from django.core.exceptions import ImproperlyConfigured

    class ConfigurationError(SqlqueueError, ImproperlyConfigured):
        """The ``SQLQUEUE`` setting (or the database behind it) cannot be used."""

    class NotMigrated(ConfigurationError):
        """sqlqueue's tables are missing or older than this version of sqlqueue: run
        ``manage.py migrate``."""

        @classmethod
        def no_tables(cls, alias: str) -> NotMigrated: ...


_DJANGO_BOUND = ("ConfigurationError", "NotMigrated")
_defining = threading.Lock()


def __getattr__(name: str) -> Any:
    if name not in _DJANGO_BOUND:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _defining:  # two threads asking at once must get the same class
        if name not in globals():
            globals().update(_django_bound_errors())
    return globals()[name]


def _django_bound_errors() -> dict[str, type[SqlqueueError]]:
    from django.core.exceptions import ImproperlyConfigured

    class ConfigurationError(SqlqueueError, ImproperlyConfigured):
        """The ``SQLQUEUE`` setting (or the database behind it) cannot be used."""

    class NotMigrated(ConfigurationError):
        """sqlqueue's tables are missing or older than this version of sqlqueue: run
        ``manage.py migrate``."""

        @classmethod
        def no_tables(cls, alias: str) -> NotMigrated:
            return cls(f"Database {alias!r} has no sqlqueue tables: run `manage.py migrate` "
                       f"(add `--database {alias}` if it is not the default database).")

    made: dict[str, type[SqlqueueError]] = {
        "ConfigurationError": ConfigurationError, "NotMigrated": NotMigrated}
    for name, cls in made.items():  # named as if defined at the top (repr, pickle, docs)
        cls.__qualname__ = name
    return made
