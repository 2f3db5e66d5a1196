"""The checks of a MySQL or MariaDB queue database: what the server and the connection are
is read once (``MySQLServer.read``), then each check id is one function of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue import storage
from sqlqueue.checks.versions import MIN_MARIADB, MIN_MYSQL, too_old
from sqlqueue.conf import QueueSettings
from sqlqueue.storage.statements import MySQLStatements
from sqlqueue.storage.statements.tables import ALL_TABLES

#: room for the rest of a row in one packet, on top of the largest payload
PACKET_MARGIN = 64 * 1024


@dataclass(frozen=True)
class MySQLServer:
    """What the checks need to know of a MySQL/MariaDB server and of Django's connection."""

    alias: str
    is_mariadb: bool
    version: tuple[int, ...]
    charset: str
    max_packet: int
    isolation: str
    #: queue table -> its collation
    collations: dict[str, str]
    galera: bool

    @property
    def product(self) -> str:
        return "MariaDB" if self.is_mariadb else "MySQL"

    @classmethod
    def read(cls, connection: BaseDatabaseWrapper) -> MySQLServer:
        with connection.cursor() as cursor:
            store = storage.store(connection)
            sql = store.sql
            assert isinstance(sql, MySQLStatements)
            cursor.execute(*sql.server_settings())
            charset, max_packet = cursor.fetchone()
            isolation = _isolation_level(cursor, sql)
            cursor.execute(*sql.table_collations(ALL_TABLES))  # each migration converts its own
            collations = {table: str(c) for table, c in cursor.fetchall()}
            galera = store.is_galera(cursor)
        return cls(alias=connection.alias,
                   is_mariadb=bool(connection.mysql_is_mariadb),  # type: ignore[attr-defined]
                   version=tuple(connection.mysql_version),  # type: ignore[attr-defined]
                   charset=charset, max_packet=int(max_packet), isolation=isolation,
                   collations=collations, galera=galera)


def check_mysql(connection: BaseDatabaseWrapper, conf: QueueSettings) -> list[CheckMessage]:
    server = MySQLServer.read(connection)
    found = (
        too_old(server.product, server.version,
                MIN_MARIADB if server.is_mariadb else MIN_MYSQL),  # E102
        galera_node(server, conf),  # W110
        charset_not_utf8mb4(server),  # E103
        tables_not_binary(server),  # E104
        reads_uncommitted(server),  # E105
        serializable(server),  # W101
        packet_too_small(server, conf),  # W102
    )
    return [message for message in found if message is not None]


def galera_node(server: MySQLServer, conf: QueueSettings) -> CheckMessage | None:
    """sqlqueue.W110: the queue's database is a Galera cluster node."""
    if not server.galera:
        return None
    return Warning(
        f"Database {conf.DATABASE!r} is a Galera cluster node: a node's "
        "information_schema.INNODB_TRX shows only its own transactions, so subscribers "
        "cannot see publishers open on other nodes. Watermarks therefore trail the head by "
        f"MAX_TRANSACTION_AGE ({conf.MAX_TRANSACTION_AGE:g}s), and a publishing "
        "transaction open longer than that on another node can be skipped.",
        hint="Send every publisher and runconsumer to one node (a single-writer layout, "
             "docs/guides/topologies.md), and keep MAX_TRANSACTION_AGE above your longest "
             "publishing transaction.",
        id="sqlqueue.W110",
    )


def charset_not_utf8mb4(server: MySQLServer) -> CheckMessage | None:
    """sqlqueue.E103 (MySQL/MariaDB): the connection's character set is not utf8mb4."""
    if server.charset == "utf8mb4":
        return None
    return Error(
        f"The connection to {server.alias!r} uses the character set {server.charset!r}; "
        "topics, keys and payloads need utf8mb4.",
        hint=f"Set DATABASES[{server.alias!r}]['OPTIONS']['charset'] = 'utf8mb4'.",
        id="sqlqueue.E103",
    )


def tables_not_binary(server: MySQLServer) -> CheckMessage | None:
    """sqlqueue.E104: queue tables that do not compare byte for byte."""
    collations = server.collations
    wrong = sorted(t for t, c in collations.items() if not _is_binary_utf8mb4(c))
    if not wrong:
        return None
    return Error(
        f"Queue tables {', '.join(wrong)} do not use a binary utf8mb4 collation: "
        + ", ".join(f"{t}={collations[t]}" for t in wrong)
        + ". Topics, keys and ids must compare byte for byte.",
        hint="Convert them: ALTER TABLE <name> CONVERT TO CHARACTER SET utf8mb4 COLLATE "
             f"{_binary_collation(server)} (docs/reference/schema.md).",
        id="sqlqueue.E104",
    )


def reads_uncommitted(server: MySQLServer) -> CheckMessage | None:
    """sqlqueue.E105: READ UNCOMMITTED shows messages that may still roll back."""
    if server.isolation != "READ-UNCOMMITTED":
        return None
    return Error(
        "The transaction isolation level is READ UNCOMMITTED: consumers would see "
        "messages of transactions that later roll back.",
        hint="Use READ COMMITTED (Django's default for MySQL) or REPEATABLE READ, via "
             "DATABASES[...]['OPTIONS']['isolation_level'].",
        id="sqlqueue.E105",
    )


def serializable(server: MySQLServer) -> CheckMessage | None:
    """sqlqueue.W101: SERIALIZABLE makes every read take locks."""
    if server.isolation != "SERIALIZABLE":
        return None
    return Warning(
        "The transaction isolation level is SERIALIZABLE: every read takes locks, "
        "so publishers and consumers block each other and deadlock more often.",
        hint="Use READ COMMITTED, Django's default for MySQL.",
        id="sqlqueue.W101",
    )


def packet_too_small(server: MySQLServer, conf: QueueSettings) -> CheckMessage | None:
    """sqlqueue.W102: the server could refuse the largest message sqlqueue accepts."""
    # A payload and its metadata (each up to MAX_PAYLOAD_BYTES) travel as escaped
    # literals: each up to twice its size (all quotes).
    if server.max_packet >= 4 * conf.MAX_PAYLOAD_BYTES + PACKET_MARGIN:
        return None
    return Warning(
        f"max_allowed_packet ({server.max_packet} bytes) is too small for "
        f"SQLQUEUE['MAX_PAYLOAD_BYTES'] ({conf.MAX_PAYLOAD_BYTES} bytes): a payload "
        "and its metadata, each up to that size, travel escaped, up to twice their "
        "size, so the largest accepted messages could be refused by the server.",
        hint="Raise max_allowed_packet on the server or lower MAX_PAYLOAD_BYTES.",
        id="sqlqueue.W102",
    )


def _is_binary_utf8mb4(collation: str) -> bool:
    return collation.startswith("utf8mb4") and collation.endswith("_bin")


def _binary_collation(server: MySQLServer) -> str:
    """The collation migration 0001 gives the queue tables (byte-wise, no padding)."""
    if server.is_mariadb:
        return "utf8mb4_nopad_bin"
    if server.version >= (8, 0, 17):
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
