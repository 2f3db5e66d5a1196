"""The exception hierarchy. Every error sqlqueue raises derives from SqlqueueError."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class SqlqueueError(Exception):
    """Root of every exception raised by sqlqueue."""


class InvalidMessage(SqlqueueError, ValueError):
    """A message was refused before anything was written.

    Raised for bad topics, partition keys, ids, payloads, metadata, priorities and
    schedules. The caller's transaction is untouched and stays usable.
    """


class ConfigurationError(SqlqueueError, ImproperlyConfigured):
    """The ``SQLQUEUE`` setting (or the database behind it) cannot be used."""


class NotMigrated(ConfigurationError):
    """sqlqueue's tables are missing or older than this version of sqlqueue: run
    ``manage.py migrate``."""

    @classmethod
    def no_tables(cls, alias: str) -> NotMigrated:
        return cls(f"Database {alias!r} has no sqlqueue tables: run `manage.py migrate` "
                   f"(add `--database {alias}` if it is not the default database).")
