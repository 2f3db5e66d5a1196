"""The column types the queue's tables share: names (topics, keys, groups, ids: at most
``MAX_NAME_BYTES``), epoch milliseconds, and the log's unsigned offset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.conf import MAX_NAME_BYTES as NAME_LENGTH

if TYPE_CHECKING:
    _BigAutoField = models.BigAutoField[int, int]
else:  # the field classes are generic for type checkers only
    _BigAutoField = models.BigAutoField


class UnsignedBigAutoField(_BigAutoField):
    """``BIGINT UNSIGNED AUTO_INCREMENT`` on MySQL/MariaDB, as the RFC's ``offset``.
    Elsewhere Django's own: a ``bigint`` identity on PostgreSQL (no unsigned types there;
    63 bits of offsets are plenty), ``integer AUTOINCREMENT`` on SQLite."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return "bigint UNSIGNED AUTO_INCREMENT"
        return super().db_type(connection)

    def rel_db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return "bigint UNSIGNED"
        return super().rel_db_type(connection)


def name_field(**kwargs: Any) -> models.CharField[str, str]:
    """A topic, partition key, group, message id or subscriber name."""
    return models.CharField(max_length=NAME_LENGTH, **kwargs)


def epoch_ms_field(**kwargs: Any) -> models.PositiveBigIntegerField[int, int]:
    """A time, in epoch milliseconds."""
    return models.PositiveBigIntegerField(**kwargs)
