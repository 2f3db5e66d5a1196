"""Database connections without Django, for Spark executors and planners.

Spark runs the data source's methods in fresh Python processes that know nothing of the
project's settings, so the database is named by a URL in the ``DATABASE_URL`` form
(``mysql://user:pass@host:3306/db``, ``sqlite:////abs/path/db.sqlite3``), parsed into a
picklable ``Database``. Connections are opened inside the methods that need them and
never pickled (Spark ships reader and writer objects to executors by pickling them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.integrations.spark.sql import Statement, Statements, statements_for

MYSQL_SCHEMES = ("mysql", "mariadb", "mysql2")
SQLITE_TIMEOUT = 30.0  # seconds a writer waits for SQLite's lock


@dataclass(frozen=True)
class Database:
    """Where the queue tables are; picklable, secret-bearing (never printed whole)."""

    vendor: str  # "mysql" or "sqlite"
    name: str  # database name, or the SQLite file
    host: str = ""
    port: int = 3306
    user: str = ""
    password: str = ""
    unix_socket: str = ""

    @classmethod
    def from_url(cls, url: str, *, user: str | None = None,
                 password: str | None = None) -> Database:
        """Parse a ``DATABASE_URL``; ``user``/``password`` override the URL's."""
        if not url:
            raise InvalidOption("option 'url' is required, e.g. "
                                "mysql://user:password@127.0.0.1:3306/shop")
        parts = urlsplit(url)
        if parts.scheme == "sqlite":
            database = cls._sqlite(parts.path)
        elif parts.scheme in MYSQL_SCHEMES:
            database = cls._mysql(url)
        else:
            raise InvalidOption(
                f"option 'url' must start with mysql:// or sqlite:// (got "
                f"{parts.scheme or 'no scheme'}://...)")
        if user is not None:
            database = replace(database, user=user)
        if password is not None:
            database = replace(database, password=password)
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
    def _mysql(cls, url: str) -> Database:
        parts = urlsplit(url)
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise InvalidOption("a MySQL url must name the database: mysql://user@host/NAME")
        try:
            port = parts.port or 3306
        except ValueError as exc:
            raise InvalidOption(f"the url's port is not a number: {exc}") from None
        query = parse_qs(parts.query)
        return cls(
            "mysql", name, host=parts.hostname or "127.0.0.1", port=port,
            user=unquote(parts.username or ""), password=unquote(parts.password or ""),
            unix_socket=query.get("unix_socket", [""])[0],
        )

    def describe(self) -> str:
        """For messages and logs: no password."""
        if self.vendor == "sqlite":
            return f"sqlite:///{self.name}"
        where = self.unix_socket or f"{self.host}:{self.port}"
        return f"mysql://{self.user}@{where}/{self.name}"

    def connect(self, *, local_infile: bool = False) -> Connection:
        """A new connection in autocommit mode (every read sees the newest commits).

        ``local_infile``: allow ``LOAD DATA LOCAL INFILE`` (the writer's fast path). Off
        otherwise: with it, the server may ask the client for any file it can read."""
        if self.vendor == "sqlite":
            raw: Any = sqlite3.connect(self.name, timeout=SQLITE_TIMEOUT, isolation_level=None)
        else:
            import MySQLdb  # mysqlclient, the driver Django uses too

            kwargs: dict[str, Any] = {
                "user": self.user, "password": self.password, "database": self.name,
                "charset": "utf8mb4", "autocommit": True, "local_infile": local_infile,
            }
            if self.unix_socket:
                kwargs["unix_socket"] = self.unix_socket
            else:
                kwargs.update(host=self.host, port=self.port)
            raw = MySQLdb.connect(**kwargs)
        return Connection(raw, statements_for(self.vendor))


class Connection:
    """A DB-API connection with the vendor's named statements (``sql``)."""

    def __init__(self, raw: Any, statements: Statements) -> None:
        self.raw = raw
        self.sql = statements

    def _sql(self, text: str) -> str:
        return text if self.sql.placeholder == "%s" else text.replace("%s", "?")

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
        unbuffered cursor, so a big range is never held in memory whole)."""
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
