"""Database connections without Django, for Spark executors and planners.

Spark runs the data source's methods in fresh Python processes that know nothing of the
project's settings, so the database is named by a URL in the ``DATABASE_URL`` form
(``mysql://user:pass@host:3306/db``, ``postgres://user:pass@host:5432/db``,
``sqlite:////abs/path/db.sqlite3``), parsed into a picklable ``Database``. Connections
are opened inside the methods that need them and never pickled (Spark ships reader and
writer objects to executors by pickling them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.storage.statements import Statement, Statements, statements_for

MYSQL_SCHEMES = ("mysql", "mariadb", "mysql2")
POSTGRESQL_SCHEMES = ("postgres", "postgresql", "pgsql")
SQLITE_TIMEOUT = 30.0  # seconds a writer waits for SQLite's lock


@dataclass(frozen=True)
class Database:
    """Where the queue tables are; picklable, secret-bearing (never printed whole)."""

    vendor: str  # "mysql", "postgresql" or "sqlite"
    name: str  # database name, or the SQLite file
    host: str = ""
    port: int = 3306
    user: str = ""
    password: str = field(default="", repr=False)
    unix_socket: str = ""  # MySQL: the socket file; PostgreSQL: the socket's directory
    tls: Tls | None = None  # TLS settings of server connections (sslMode, sslCa, ...)

    @classmethod
    def from_url(cls, url: str, *, user: str | None = None,
                 password: str | None = None, tls: Tls | None = None) -> Database:
        """Parse a ``DATABASE_URL``; ``user``/``password`` override the URL's."""
        if not url:
            raise InvalidOption("option 'url' is required, e.g. "
                                "mysql://user:password@127.0.0.1:3306/shop")
        parts = urlsplit(url)
        if parts.scheme == "sqlite":
            database = cls._sqlite(parts.path)
        elif parts.scheme in MYSQL_SCHEMES:
            database = cls._server(url, "mysql", 3306)
        elif parts.scheme in POSTGRESQL_SCHEMES:
            database = cls._server(url, "postgresql", 5432)
        else:
            raise InvalidOption(
                f"option 'url' must start with mysql://, postgres:// or sqlite:// (got "
                f"{parts.scheme or 'no scheme'}://...)")
        if user is not None:
            database = replace(database, user=user)
        if password is not None:
            database = replace(database, password=password)
        if tls is not None and database.vendor != "sqlite":
            database = replace(database, tls=tls)
        return database

    @classmethod
    def _sqlite(cls, path: str) -> Database:
        # django-environ's rule: sqlite:////abs/path -> /abs/path, sqlite:///rel -> rel
        name = unquote(path[1:] if path.startswith("/") else path)
        if not name or name == ":memory:":
            raise InvalidOption("a SQLite url must name a file (sqlite:////abs/path.sqlite3): "
                                "Spark's processes cannot share an in-memory database")
        return cls("sqlite", name)

    @classmethod
    def _server(cls, url: str, vendor: str, default_port: int) -> Database:
        """A MySQL/MariaDB or PostgreSQL url. A socket is given in the query:
        ``?unix_socket=/run/mysqld/mysqld.sock``, ``?host=/var/run/postgresql``."""
        parts = urlsplit(url)
        # A '/', '?' or '#' left raw in the password ends the host part early: the rest
        # of the password would land in the port, the database name and the messages
        # that show them. The errors here never quote the url.
        if "@" not in parts.netloc and "@" in url.partition("://")[2]:
            raise InvalidOption(
                "the url's user or password holds a '/', '?' or '#': percent-encode them "
                "(%2F, %3F, %23), or pass the password with the 'password' option")
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise InvalidOption(f"a {vendor} url must name the database: "
                                f"{parts.scheme}://user@host/NAME")
        try:
            port = parts.port or default_port
        except ValueError:
            raise InvalidOption("the url's port is not a number from 1 to 65535") from None
        query = parse_qs(parts.query)
        socket = query.get("unix_socket", [""])[0]
        if vendor == "postgresql" and query.get("host", [""])[0].startswith("/"):
            socket = query["host"][0]
        return cls(
            vendor, name, host=parts.hostname or "127.0.0.1", port=port,
            user=unquote(parts.username or ""), password=unquote(parts.password or ""),
            unix_socket=socket,
        )

    def describe(self) -> str:
        """For messages and logs: no password."""
        if self.vendor == "sqlite":
            return f"sqlite:///{self.name}"
        scheme = "postgres" if self.vendor == "postgresql" else "mysql"
        where = self.unix_socket or f"{self.host}:{self.port}"
        return f"{scheme}://{self.user}@{where}/{self.name}"

    def connect(self, *, bulk_load: bool = False) -> Connection:
        """A new connection in autocommit mode (every read sees the newest commits).

        ``local_infile`` is off: with it on, the server may ask the client for any file it
        can read, after any statement. ``bulk_load``: leave libmariadb's "auto" mode
        instead, which refuses a file request unless the last statement began with
        ``LOAD``; the writer opens such a connection for one LOAD statement and installs
        a handler that serves only its own data (``sqlqueue.integrations.spark.infile``)."""
        if self.vendor == "sqlite":
            raw: Any = sqlite3.connect(self.name, timeout=SQLITE_TIMEOUT, isolation_level=None)
        elif self.vendor == "postgresql":
            raw = self._postgresql()
        else:
            import MySQLdb  # mysqlclient, the driver Django uses too

            kwargs: dict[str, Any] = {
                "user": self.user, "password": self.password, "database": self.name,
                "charset": "utf8mb4", "autocommit": True,
            }
            if not bulk_load:
                kwargs["local_infile"] = False
            if self.tls is not None:
                kwargs.update(self.tls.connect_kwargs())
            if self.unix_socket:
                kwargs["unix_socket"] = self.unix_socket
            else:
                kwargs.update(host=self.host, port=self.port)
            raw = MySQLdb.connect(**kwargs)
        return Connection(raw, statements_for(self.vendor))

    def _postgresql(self) -> Any:
        """psycopg 3 (the driver Django uses), in autocommit. ``jsonb`` is read as the
        text it holds, as the other vendors return metadata."""
        import psycopg
        from psycopg.types.string import TextLoader

        kwargs: dict[str, Any] = {
            "dbname": self.name, "user": self.user, "password": self.password,
            "host": self.unix_socket or self.host, "port": self.port, "autocommit": True,
            "application_name": "sqlqueue-spark",
        }
        if self.tls is not None:
            kwargs.update(self.tls.libpq_kwargs())
        raw = psycopg.connect(**{k: v for k, v in kwargs.items() if v != ""})
        raw.adapters.register_loader("jsonb", TextLoader)
        return raw


TLS_MODES = ("disabled", "preferred", "required", "verify-ca", "verify-identity")
LIBPQ_SSL_MODES = {"disabled": "disable", "preferred": "prefer", "required": "require",
                   "verify-ca": "verify-ca", "verify-identity": "verify-full"}


@dataclass(frozen=True)
class Tls:
    """How MySQL connections use TLS: ``mode`` as MySQL's ``--ssl-mode``, lower case
    (``verify-ca`` and ``verify-identity`` check the server's certificate against
    ``ca``), and the client's own certificate and key files for X.509 accounts."""

    mode: str = "preferred"
    ca: str = ""
    cert: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        if self.mode not in TLS_MODES:
            raise InvalidOption(f"option 'sslMode' is one of {', '.join(TLS_MODES)}; "
                                f"got {self.mode!r}")
        if self.mode.startswith("verify") and not self.ca:
            raise InvalidOption(f"option 'sslMode' {self.mode} needs 'sslCa', the file "
                                "of the certificate authority to verify the server with")
        if bool(self.cert) != bool(self.key):
            raise InvalidOption("options 'sslCert' and 'sslKey' go together")

    def libpq_kwargs(self) -> dict[str, str]:
        """libpq's ``sslmode`` and certificate files (the same modes, libpq's names)."""
        kwargs = {"sslmode": LIBPQ_SSL_MODES[self.mode]}
        for name, value in (("sslrootcert", self.ca), ("sslcert", self.cert),
                            ("sslkey", self.key)):
            if value:
                kwargs[name] = value
        return kwargs

    def connect_kwargs(self) -> dict[str, Any]:
        """mysqlclient's ``ssl_mode`` and ``ssl`` arguments."""
        kwargs: dict[str, Any] = {"ssl_mode": self.mode.upper().replace("-", "_")}
        files = {k: v for k, v in (("ca", self.ca), ("cert", self.cert), ("key", self.key))
                 if v}
        if files:
            kwargs["ssl"] = files
        return kwargs


class Connection:
    """A DB-API connection with the vendor's named statements (``sql``)."""

    def __init__(self, raw: Any, statements: Statements) -> None:
        self.raw = raw
        self.sql = statements

    def _sql(self, text: str) -> str:
        # sqlite3 takes qmark placeholders; the other drivers take the statements' %s.
        return text.replace("%s", "?") if self.sql.vendor == "sqlite" else text

    def run(self, statement: Statement) -> int:
        """Execute; return the number of rows changed."""
        cursor = self.raw.cursor()
        try:
            cursor.execute(self._sql(statement[0]), statement[1])
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        cursor = self.raw.cursor()
        try:
            cursor.execute(self._sql(statement[0]), statement[1])
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def one(self, statement: Statement) -> tuple[Any, ...] | None:
        found = self.rows(statement)
        return found[0] if found else None

    def batches(self, statement: Statement, size: int) -> Iterator[Sequence[tuple[Any, ...]]]:
        """Rows in lists of at most ``size``, streamed from the server (MySQL: an
        unbuffered cursor; PostgreSQL: a server-side cursor, in a read-only transaction
        of its own, which holds no transaction id and so never holds back the write
        horizon), so a big range is never held in memory whole."""
        if self.sql.vendor == "postgresql":
            yield from self._server_side_batches(statement, size)
            return
        if self.sql.vendor == "mysql":
            from MySQLdb.cursors import SSCursor

            cursor = self.raw.cursor(SSCursor)
        else:
            cursor = self.raw.cursor()
        try:
            cursor.execute(self._sql(statement[0]), statement[1])
            while True:
                chunk = cursor.fetchmany(size)
                if not chunk:
                    return
                yield chunk
        finally:
            cursor.close()

    def _server_side_batches(self, statement: Statement,
                             size: int) -> Iterator[Sequence[tuple[Any, ...]]]:
        with self.raw.transaction(), self.raw.cursor(name="sqlqueue_spark_rows") as cursor:
            cursor.itersize = size
            cursor.execute(statement[0], statement[1])
            while True:
                chunk = cursor.fetchmany(size)
                if not chunk:
                    return
                yield [tuple(row) for row in chunk]

    def copy_rows(self, statement: Statement, rows: Iterable[Sequence[Any]]) -> None:
        """PostgreSQL: stream ``rows`` into a ``COPY ... FROM STDIN`` statement."""
        with self.raw.cursor() as cursor, cursor.copy(statement[0], statement[1]) as copy:
            for row in rows:
                copy.write_row(row)

    @contextmanager
    def transaction(self, begin: str | None = None) -> Iterator[None]:
        """One transaction; rolled back if the block raises. SQLite takes its write lock
        at once (BEGIN IMMEDIATE), so two writers queue up instead of failing. ``begin``:
        another statement to begin it with (``sql.begin_snapshot_sql``)."""
        self.run((begin or self.sql.begin_sql, []))
        try:
            yield
        except BaseException:
            self.raw.rollback()
            raise
        else:
            self.raw.commit()

    def close(self) -> None:
        with suppress(Exception):  # a connection that is gone is closed
            self.raw.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
