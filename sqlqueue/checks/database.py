"""The database checks: which databases are checked (the queue's, and the aliases it
routes to or reads from), sqlqueue.E101 for a vendor sqlqueue does not run on and
sqlqueue.W103 for a database that cannot be inspected; the vendors' own checks are in
``mysql``, ``postgresql``, ``sqlite`` and ``poolers``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.checks.mysql import check_mysql
from sqlqueue.checks.poolers import behind_pooler, pooler_problems
from sqlqueue.checks.postgresql import check_postgresql
from sqlqueue.checks.sqlite import check_sqlite
from sqlqueue.conf import QueueSettings, validate
from sqlqueue.storage.sql import SUPPORTED_VENDORS


def check_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    if conf is None:
        return []  # the settings check reports the problem
    messages = []
    if databases is None or conf.DATABASE in databases:
        messages += _check_queue_database(conf)
    for alias in _other_aliases(conf):
        if databases is None or alias in databases:
            messages += _check_other_alias(alias, conf)
    return messages


def _other_aliases(conf: QueueSettings) -> list[str]:
    """The aliases sqlqueue uses beside ``DATABASE``: routed topics' databases and read
    replicas (the listener aliases are the listener's own psycopg sessions, trusted
    behind a pooler: see the topologies guide)."""
    return [alias for alias in dict.fromkeys(
        [*conf.databases, *(replica for _, replica in conf.READ_REPLICAS)])
        if alias != conf.DATABASE]


def _check_other_alias(alias: str, conf: QueueSettings) -> list[CheckMessage]:
    """The pooler checks (W106, W107) of a routed database or a read replica."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            pooled = behind_pooler(cursor, connection)
    except DatabaseError as exc:
        return [not_inspected(alias, exc)]
    return pooler_problems(connection, conf) if pooled else []


def _check_queue_database(conf: QueueSettings) -> list[CheckMessage]:
    connection = connections[conf.DATABASE]
    if connection.vendor not in SUPPORTED_VENDORS:
        return [unsupported_vendor(connection, conf)]
    try:
        if connection.vendor == "mysql":
            return check_mysql(connection, conf)
        if connection.vendor == "postgresql":
            return check_postgresql(connection, conf)
        return check_sqlite(connection)
    except DatabaseError as exc:
        return [not_inspected(conf.DATABASE, exc)]


def unsupported_vendor(connection: BaseDatabaseWrapper, conf: QueueSettings) -> CheckMessage:
    """sqlqueue.E101: the queue's database is of a vendor sqlqueue does not run on."""
    return Error(
        f"SQLQUEUE['DATABASE'] ({conf.DATABASE!r}) is a {connection.vendor} database; "
        "sqlqueue supports MySQL 8.0+, MariaDB 10.11+, PostgreSQL 14+ and SQLite.",
        id="sqlqueue.E101",
    )


def not_inspected(alias: str, error: DatabaseError) -> CheckMessage:
    """sqlqueue.W103: the database could not be read (down, unreachable, no rights)."""
    return Warning(
        f"Could not inspect database {alias!r}: {error}",
        hint=f"Run 'manage.py check --database {alias}' once it is reachable.",
        id="sqlqueue.W103",
    )
