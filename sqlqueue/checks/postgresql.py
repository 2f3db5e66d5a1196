"""The checks of a PostgreSQL queue database: what the server and the connection are is
read once (``PostgreSQLServer.read``), then each check id is one function of it (the
pooler's in ``poolers``)."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.checks import CheckMessage, Error, Warning
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue import storage
from sqlqueue.checks.poolers import behind_pooler, pooler_problems
from sqlqueue.checks.versions import MIN_POSTGRESQL, too_old
from sqlqueue.conf import QueueSettings
from sqlqueue.storage.statements import PostgreSQLStatements


@dataclass(frozen=True)
class PostgreSQLServer:
    """What the checks need to know of a PostgreSQL server and of Django's connection."""

    alias: str
    version: tuple[int, int]
    encoding: str
    #: the isolation level of the connection's transactions, e.g. "READ COMMITTED"
    isolation: str
    #: the role may read every session's pg_stat_activity row
    sees_every_session: bool
    #: no connection pooler between Django and the server
    direct: bool

    @classmethod
    def read(cls, connection: BaseDatabaseWrapper) -> PostgreSQLServer:
        number = int(connection.pg_version)  # type: ignore[attr-defined]  # e.g. 150020
        store = storage.store(connection)
        with connection.cursor() as cursor:
            sql = store.sql
            assert isinstance(sql, PostgreSQLStatements)
            cursor.execute(*sql.server_settings())
            encoding, server_isolation = cursor.fetchone()
            cursor.execute(*sql.horizon_privileges())
            (sees_every_session,) = cursor.fetchone()
            direct = not behind_pooler(cursor, connection)
        # Django's OPTIONS['isolation_level'] (a psycopg IsolationLevel) overrides the
        # server's default for every transaction of the connection.
        option = connection.settings_dict.get("OPTIONS", {}).get("isolation_level")
        isolation = (getattr(option, "name", str(option)).replace("_", " ")
                     if option is not None else str(server_isolation)).upper()
        return cls(alias=connection.alias, version=(number // 10000, number % 10000),
                   encoding=str(encoding), isolation=isolation,
                   sees_every_session=bool(sees_every_session), direct=bool(direct))


def check_postgresql(connection: BaseDatabaseWrapper,
                     conf: QueueSettings) -> list[CheckMessage]:
    server = PostgreSQLServer.read(connection)
    found = (
        too_old("PostgreSQL", server.version, MIN_POSTGRESQL),  # E102
        encoding_not_utf8(server, conf),  # E103
        not_read_committed(server),  # E106
        sessions_hidden(server, conf),  # W105
    )
    messages = [message for message in found if message is not None]
    if not server.direct:
        messages += pooler_problems(connection, conf)  # W106, W107
    return messages


def encoding_not_utf8(server: PostgreSQLServer, conf: QueueSettings) -> CheckMessage | None:
    """sqlqueue.E103 (PostgreSQL): the database's encoding is not UTF8."""
    if server.encoding.upper() in ("UTF8", "UTF-8"):
        return None
    return Error(
        f"Database {conf.DATABASE!r} uses the encoding {server.encoding!r}; topics, keys and "
        "ids need UTF8.",
        hint="Create the database with ENCODING 'UTF8' (and a UTF-8 locale, or C).",
        id="sqlqueue.E103",
    )


def not_read_committed(server: PostgreSQLServer) -> CheckMessage | None:
    """sqlqueue.E106: sqlqueue's locking reads need READ COMMITTED."""
    if server.isolation in ("READ COMMITTED", "READ UNCOMMITTED"):  # the latter is the former
        return None
    return Error(
        f"The transaction isolation level of {server.alias!r} is {server.isolation}: "
        "sqlqueue's locking reads would fail with serialization errors whenever a "
        "subscriber renews a lease, and each statement must see the rows committed "
        "before it.",
        hint="Use READ COMMITTED, Django's and PostgreSQL's default (remove "
             "OPTIONS['isolation_level'] or default_transaction_isolation).",
        id="sqlqueue.E106",
    )


def sessions_hidden(server: PostgreSQLServer, conf: QueueSettings) -> CheckMessage | None:
    """sqlqueue.W105: the role cannot see when other roles' transactions began."""
    if server.sees_every_session:
        return None
    return Warning(
        f"The role of {server.alias!r} cannot see other roles' sessions in "
        "pg_stat_activity: while a session of another role holds a transaction, "
        "subscribers cannot tell when it began, and watermarks trail the head by "
        f"MAX_TRANSACTION_AGE ({conf.MAX_TRANSACTION_AGE:g}s).",
        hint="GRANT pg_read_all_stats TO <role> (or publish and consume as one role).",
        id="sqlqueue.W105",
    )
