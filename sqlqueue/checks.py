"""System checks. Ids are stable and documented in docs/reference/checks.md.

Settings checks (``sqlqueue.E001``-``E009``, ``W001``-``W004``, ``E202`` for ``TASKS``
entries) run with every ``manage.py check``. Database checks (``E101``-``E106``,
``W101``-``W107``) need a connection, so Django runs them only with ``check --database``
and before ``migrate``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue import storage
from sqlqueue.conf import QueueSettings, validate
from sqlqueue.storage.sql import SUPPORTED_VENDORS
from sqlqueue.storage.sql.postgresql import reaches_server_directly
from sqlqueue.storage.statements import MySQLStatements, PostgreSQLStatements
from sqlqueue.storage.statements.tables import ALL_TABLES
from sqlqueue.wakeups.postgresql import past_pooler_problem

MIN_MYSQL = (8, 0)
MIN_MARIADB = (10, 11)
MIN_SQLITE = (3, 35)
MIN_POSTGRESQL = (14,)
#: room for the rest of a row in one packet, on top of the largest payload
PACKET_MARGIN = 64 * 1024


def _message(problem_id: str, msg: str, hint: str | None = None) -> CheckMessage:
    kind = Error if ".E" in problem_id else Warning
    return kind(msg, hint=hint, id=problem_id)


@register("sqlqueue")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    _, problems = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    return [_message(p.id, p.msg, p.hint) for p in problems]


@register("sqlqueue", Tags.admin)
def check_admin_apps(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """sqlqueue's admin pages filter by date with django-admin-rangefilter, whose templates
    Django finds only when ``"rangefilter"`` is an installed app."""
    if not apps.is_installed("django.contrib.admin") or apps.is_installed("rangefilter"):
        return []
    return [Warning(
        "'rangefilter' is not in INSTALLED_APPS: the sqlqueue admin's Messages and Dead "
        "letters pages are shown without their date-range filters.",
        hint="Add 'rangefilter' (django-admin-rangefilter, installed with sqlqueue) to "
             "INSTALLED_APPS.",
        id="sqlqueue.W003",
    )]


@register("sqlqueue")
def check_wakeup_channels(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """A Redis wake-up channel needs the ``redis`` package (the ``redis`` extra)."""
    conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    if conf is None or not conf.WAKEUP_REDIS_URL or importlib.util.find_spec("redis"):
        return []
    return [Warning(
        "SQLQUEUE['WAKEUP_REDIS_URL'] is set but the 'redis' package is not installed: "
        "runners wake up by polling only.",
        hint='pip install "django-sqlqueue[redis]", or remove WAKEUP_REDIS_URL.',
        id="sqlqueue.W004",
    )]


@register("sqlqueue")
def check_task_backends(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Bad ``TASKS`` entries of ours: reported here rather than raised at start-up."""
    from sqlqueue.integrations.tasks.registration import task_backend_problems

    return [Error(
        problem,
        hint="Fix this TASKS entry (docs/guides/tasks.md); its tasks cannot be enqueued "
             "or run until then.",
        id="sqlqueue.E202",
    ) for _, problem in task_backend_problems()]


@register("sqlqueue")
def check_schedules(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every unusable entry of ``SQLQUEUE["SCHEDULES"]`` (sqlqueue.E301-E309)."""
    from sqlqueue.scheduling.validation import schedule_errors

    conf, _ = validate(getattr(settings, "SQLQUEUE", None), settings.DATABASES)
    if conf is None:
        return []  # check_settings reports why
    return [Error(str(error), hint="docs/guides/schedules.md lists what a schedule takes.",
                  id=error.check_id) for error in schedule_errors(conf)]


@register(Tags.database)
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
            direct = reaches_server_directly(cursor, connection.connection.info.backend_pid)
    except DatabaseError as exc:
        return [Warning(f"Could not inspect database {alias!r}: {exc}",
                        hint=f"Run 'manage.py check --database {alias}' once it is reachable.",
                        id="sqlqueue.W103")]
    return [] if direct else _pooler_problems(connection, conf)


def _check_queue_database(conf: QueueSettings) -> list[CheckMessage]:
    connection = connections[conf.DATABASE]
    if connection.vendor not in SUPPORTED_VENDORS:
        return [Error(
            f"SQLQUEUE['DATABASE'] ({conf.DATABASE!r}) is a {connection.vendor} database; "
            "sqlqueue supports MySQL 8.0+, MariaDB 10.11+, PostgreSQL 14+ and SQLite.",
            id="sqlqueue.E101",
        )]
    try:
        if connection.vendor == "mysql":
            return _check_mysql(connection, conf)
        if connection.vendor == "postgresql":
            return _check_postgresql(connection, conf)
        return _check_sqlite(connection)
    except DatabaseError as exc:
        return [Warning(
            f"Could not inspect database {conf.DATABASE!r}: {exc}",
            hint=f"Run 'manage.py check --database {conf.DATABASE}' once it is reachable.",
            id="sqlqueue.W103",
        )]


def _version_text(numbers: Sequence[int]) -> str:
    return ".".join(str(n) for n in numbers)


def _check_mysql(connection: BaseDatabaseWrapper, conf: QueueSettings) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    is_mariadb = bool(connection.mysql_is_mariadb)  # type: ignore[attr-defined]
    version = tuple(connection.mysql_version)  # type: ignore[attr-defined]
    minimum = MIN_MARIADB if is_mariadb else MIN_MYSQL
    if version < minimum:
        product = "MariaDB" if is_mariadb else "MySQL"
        messages.append(Error(
            f"{product} {_version_text(version)} is too old for sqlqueue; "
            f"{product} {_version_text(minimum)} or newer is required.",
            id="sqlqueue.E102",
        ))
    with connection.cursor() as cursor:
        store = storage.store(connection)
        sql = store.sql
        assert isinstance(sql, MySQLStatements)
        cursor.execute(*sql.server_settings())
        charset, max_packet = cursor.fetchone()
        isolation = _isolation_level(cursor, sql)
        cursor.execute(*sql.table_collations(ALL_TABLES))  # each migration converts its own
        collations = dict(cursor.fetchall())
        galera = store.is_galera(cursor)
    if galera:
        messages.append(Warning(
            f"Database {conf.DATABASE!r} is a Galera cluster node: a node's "
            "information_schema.INNODB_TRX shows only its own transactions, so subscribers "
            "cannot see publishers open on other nodes. Watermarks therefore trail the head by "
            f"MAX_TRANSACTION_AGE ({conf.MAX_TRANSACTION_AGE:g}s), and a publishing "
            "transaction open longer than that on another node can be skipped.",
            hint="Send every publisher and runconsumer to one node (a single-writer layout, "
                 "docs/guides/topologies.md), and keep MAX_TRANSACTION_AGE above your longest "
                 "publishing transaction.",
            id="sqlqueue.W110",
        ))
    if charset != "utf8mb4":
        messages.append(Error(
            f"The connection to {connection.alias!r} uses the character set {charset!r}; "
            "topics, keys and payloads need utf8mb4.",
            hint=f"Set DATABASES[{connection.alias!r}]['OPTIONS']['charset'] = 'utf8mb4'.",
            id="sqlqueue.E103",
        ))
    wrong = sorted(t for t, c in collations.items() if not _is_binary_utf8mb4(str(c)))
    if wrong:
        messages.append(Error(
            f"Queue tables {', '.join(wrong)} do not use a binary utf8mb4 collation: "
            + ", ".join(f"{t}={collations[t]}" for t in wrong)
            + ". Topics, keys and ids must compare byte for byte.",
            hint="Convert them: ALTER TABLE <name> CONVERT TO CHARACTER SET utf8mb4 COLLATE "
                 f"{_binary_collation(connection)} (docs/reference/schema.md).",
            id="sqlqueue.E104",
        ))
    if isolation == "READ-UNCOMMITTED":
        messages.append(Error(
            "The transaction isolation level is READ UNCOMMITTED: consumers would see "
            "messages of transactions that later roll back.",
            hint="Use READ COMMITTED (Django's default for MySQL) or REPEATABLE READ, via "
                 "DATABASES[...]['OPTIONS']['isolation_level'].",
            id="sqlqueue.E105",
        ))
    elif isolation == "SERIALIZABLE":
        messages.append(Warning(
            "The transaction isolation level is SERIALIZABLE: every read takes locks, "
            "so publishers and consumers block each other and deadlock more often.",
            hint="Use READ COMMITTED, Django's default for MySQL.",
            id="sqlqueue.W101",
        ))
    # A payload and its metadata (each up to MAX_PAYLOAD_BYTES) travel as escaped
    # literals: each up to twice its size (all quotes).
    if int(max_packet) < 4 * conf.MAX_PAYLOAD_BYTES + PACKET_MARGIN:
        messages.append(Warning(
            f"max_allowed_packet ({max_packet} bytes) is too small for "
            f"SQLQUEUE['MAX_PAYLOAD_BYTES'] ({conf.MAX_PAYLOAD_BYTES} bytes): a payload "
            "and its metadata, each up to that size, travel escaped, up to twice their "
            "size, so the largest accepted messages could be refused by the server.",
            hint="Raise max_allowed_packet on the server or lower MAX_PAYLOAD_BYTES.",
            id="sqlqueue.W102",
        ))
    return messages


def _is_binary_utf8mb4(collation: str) -> bool:
    return collation.startswith("utf8mb4") and collation.endswith("_bin")


def _binary_collation(connection: BaseDatabaseWrapper) -> str:
    """The collation migration 0001 gives the queue tables (byte-wise, no padding)."""
    if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        return "utf8mb4_nopad_bin"
    if tuple(connection.mysql_version) >= (8, 0, 17):  # type: ignore[attr-defined]
        return "utf8mb4_0900_bin"
    return "utf8mb4_bin"


def _isolation_level(cursor: Any, sql: MySQLStatements) -> str:
    # MySQL 8 and MariaDB >= 11.1 call it transaction_isolation; older MariaDB tx_isolation.
    for variable in ("transaction_isolation", "tx_isolation"):
        try:
            cursor.execute(*sql.isolation_level(variable))
        except DatabaseError:
            continue
        return str(cursor.fetchone()[0]).upper().replace(" ", "-")
    return ""


def _check_postgresql(connection: BaseDatabaseWrapper,
                      conf: QueueSettings) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    number = int(connection.pg_version)  # type: ignore[attr-defined]  # e.g. 150020
    version = (number // 10000, number % 10000)
    if version[:1] < MIN_POSTGRESQL:
        messages.append(Error(
            f"PostgreSQL {_version_text(version)} is too old for sqlqueue; "
            f"PostgreSQL {_version_text(MIN_POSTGRESQL)} or newer is required.",
            id="sqlqueue.E102",
        ))
    store = storage.store(connection)
    with connection.cursor() as cursor:
        sql = store.sql
        assert isinstance(sql, PostgreSQLStatements)
        cursor.execute(*sql.server_settings())
        encoding, server_isolation = cursor.fetchone()
        cursor.execute(*sql.horizon_privileges())
        (sees_every_session,) = cursor.fetchone()
        direct = reaches_server_directly(cursor, connection.connection.info.backend_pid)
    if str(encoding).upper() not in ("UTF8", "UTF-8"):
        messages.append(Error(
            f"Database {conf.DATABASE!r} uses the encoding {encoding!r}; topics, keys and "
            "ids need UTF8.",
            hint="Create the database with ENCODING 'UTF8' (and a UTF-8 locale, or C).",
            id="sqlqueue.E103",
        ))
    # Django's OPTIONS['isolation_level'] (a psycopg IsolationLevel) overrides the
    # server's default for every transaction of the connection.
    option = connection.settings_dict.get("OPTIONS", {}).get("isolation_level")
    isolation = (getattr(option, "name", str(option)).replace("_", " ") if option is not None
                 else str(server_isolation)).upper()
    if isolation not in ("READ COMMITTED", "READ UNCOMMITTED"):  # the latter is the former
        messages.append(Error(
            f"The transaction isolation level of {connection.alias!r} is {isolation}: "
            "sqlqueue's locking reads would fail with serialization errors whenever a "
            "subscriber renews a lease, and each statement must see the rows committed "
            "before it.",
            hint="Use READ COMMITTED, Django's and PostgreSQL's default (remove "
                 "OPTIONS['isolation_level'] or default_transaction_isolation).",
            id="sqlqueue.E106",
        ))
    if not sees_every_session:
        messages.append(Warning(
            f"The role of {connection.alias!r} cannot see other roles' sessions in "
            "pg_stat_activity: while a session of another role holds a transaction, "
            "subscribers cannot tell when it began, and watermarks trail the head by "
            f"MAX_TRANSACTION_AGE ({conf.MAX_TRANSACTION_AGE:g}s).",
            hint="GRANT pg_read_all_stats TO <role> (or publish and consume as one role).",
            id="sqlqueue.W105",
        ))
    if not direct:
        messages += _pooler_problems(connection, conf)
    return messages


def _pooler_problems(connection: BaseDatabaseWrapper,
                     conf: QueueSettings) -> list[CheckMessage]:
    """What does not work through the connection pooler in front of ``connection``
    (seen at check time: its ``pg_backend_pid()`` differs from the pid the connection was
    told)? The pool mode and the pooler's version are not visible to a client, so these
    warn about what breaks in transaction mode and before PgBouncer 1.21."""
    messages: list[CheckMessage] = []
    alias = connection.alias
    consumed = alias in conf.databases  # runners consume there (a replica: the admin reads)
    problem = (past_pooler_problem(alias)
               if consumed and conf.WAKEUPS and not conf.has_listen_alias(alias) else None)
    if problem is not None:
        messages.append(Warning(
            f"Database {alias!r} is reached through a connection pooler and the wake-up "
            "listener has no alias of its own: a LISTEN through a transaction pool hears "
            "nothing, and the listener cannot reach the server behind the pooler directly "
            f"either ({problem}), so runners switch their listener off (with a warning) "
            "and poll.",
            hint=f"Add an alias that connects straight to PostgreSQL (or through a "
                 f"session-mode pool) and set SQLQUEUE['WAKEUP_LISTEN_DATABASES'] = "
                 f"{{{alias!r}: '<that alias>'}} (or {{{alias!r}: {alias!r}}} if this one is "
                 "a session-mode pool); or SQLQUEUE['WAKEUPS'] = False.",
            id="sqlqueue.W106",
        ))
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        messages.append(Warning(
            f"Database {alias!r} binds parameters on the server (OPTIONS"
            "['server_side_binding']) through a connection pooler: psycopg then prepares "
            "statements, which a transaction-mode PgBouncer older than 1.21 (or without "
            "max_prepared_statements) mixes up between clients ('prepared statement "
            "\"_pg3_N\" already exists'), failing publishes and consumer passes.",
            hint="Remove OPTIONS['server_side_binding'], or run PgBouncer 1.21+ with "
                 "max_prepared_statements > 0 (then silence sqlqueue.W107 in "
                 "SILENCED_SYSTEM_CHECKS).",
            id="sqlqueue.W107",
        ))
    return messages


def _check_sqlite(connection: BaseDatabaseWrapper) -> list[CheckMessage]:
    import sqlite3

    messages: list[CheckMessage] = []
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        messages.append(Error(
            f"SQLite {sqlite3.sqlite_version} is too old for sqlqueue; "
            f"{_version_text(MIN_SQLITE)} or newer is required.",
            id="sqlqueue.E102",
        ))
    mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") or "")
    if mode.upper() != "IMMEDIATE":
        messages.append(Warning(
            f"SQLite database {connection.alias!r} does not start transactions in IMMEDIATE "
            "mode: a publisher and a consumer writing at once fail with 'database is locked'.",
            hint=f"Set DATABASES[{connection.alias!r}]['OPTIONS']['transaction_mode'] = "
                 "'IMMEDIATE' (Django 5.1+).",
            id="sqlqueue.W104",
        ))
    return messages
