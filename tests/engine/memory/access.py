"""What every part of ``MemoryStore`` (``store``, ``publishing``, ``membership``) reaches
its tables through: the connection it was made for, its database, and the database's
clock (the harness's injected one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.engine.memory.tables import MemoryDatabase, Tables

if TYPE_CHECKING:
    from tests.engine.memory.base import DatabaseWrapper


class TableAccess:
    """The base of ``MemoryStore``'s parts (not of the real ``Store``)."""

    vendor = "memory"

    def __init__(self, connection: DatabaseWrapper) -> None:
        self.connection = connection

    @property
    def database(self) -> MemoryDatabase:
        return self.connection.database

    def _tables(self, statement: str) -> Tables:
        """The tables, for the statement named (counted in ``MemoryDatabase.statements``)."""
        self.connection.ensure_connection()
        return self.database.use(self.connection.connection, statement)

    def _now(self) -> int:
        return self.database.now_ms()
