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
