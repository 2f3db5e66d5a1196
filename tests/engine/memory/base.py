"""The ``memory`` backend's ``DatabaseWrapper``: Django's transaction machinery
(``atomic``, savepoints, ``on_commit``) on a ``MemoryDatabase``; no SQL at all.

The database is named by ``NAME`` in ``MEMORY_DATABASES`` (``register``): every alias
with the same ``NAME`` reaches the same tables, as two connections reach one server.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.client import BaseDatabaseClient
from django.db.backends.base.creation import BaseDatabaseCreation
from django.db.backends.base.features import BaseDatabaseFeatures
from django.db.backends.base.introspection import BaseDatabaseIntrospection
from django.db.backends.base.operations import BaseDatabaseOperations

from sqlqueue.storage.protocols import EngineStore
from tests.engine.memory.tables import MemoryConnection, MemoryDatabase

#: NAME -> database (``register``; the harness removes it again)
MEMORY_DATABASES: dict[str, MemoryDatabase] = {}


def register(name: str, database: MemoryDatabase) -> None:
    MEMORY_DATABASES[name] = database


def unregister(name: str) -> None:
    MEMORY_DATABASES.pop(name, None)


class DatabaseFeatures(BaseDatabaseFeatures):
    uses_savepoints = True
    can_release_savepoints = True
    supports_transactions = True
    max_query_params = None


class DatabaseOperations(BaseDatabaseOperations):
    def quote_name(self, name: str) -> str:
        return f'"{name}"'


class DatabaseClient(BaseDatabaseClient):
    executable_name = ""


class DatabaseWrapper(BaseDatabaseWrapper):
    vendor = "memory"
    display_name = "in-memory (tests)"
    client_class = DatabaseClient
    creation_class = BaseDatabaseCreation
    features_class = DatabaseFeatures
    introspection_class = BaseDatabaseIntrospection
    ops_class = DatabaseOperations
    connection: MemoryConnection | None

    @property
    def database(self) -> MemoryDatabase:
        return MEMORY_DATABASES[self.settings_dict["NAME"]]

    def sqlqueue_store(self) -> EngineStore:
        """The queue's named statements for this connection (``store_for``'s hook).
        Typed ``EngineStore``: mypy checks here that ``MemoryStore`` implements every
        engine protocol."""
        from tests.engine.memory.store import MemoryStore

        return MemoryStore(self)

    # -- the connection ---------------------------------------------------------------------
    def ensure_connection(self) -> None:
        # No database to reach, so nothing pytest-django's database blocker guards: the
        # unit tier runs on it.
        if self.connection is None:
            self.connect()

    def get_connection_params(self) -> dict[str, Any]:
        return {}

    def get_new_connection(self, conn_params: dict[str, Any]) -> MemoryConnection:
        return MemoryConnection(self.database, self.alias)

    def init_connection_state(self) -> None:
        pass

    def create_cursor(self, name: str | None = None) -> Any:
        assert self.connection is not None
        return self.connection.cursor()

    def is_usable(self) -> bool:
        return True

    # -- transactions -----------------------------------------------------------------------
    def _set_autocommit(self, autocommit: bool) -> None:
        assert self.connection is not None
        self.connection.set_autocommit(autocommit)

    def _savepoint(self, sid: str) -> None:
        assert self.connection is not None
        self.connection.savepoint(sid)

    def _savepoint_rollback(self, sid: str) -> None:
        assert self.connection is not None
        self.connection.savepoint_rollback(sid)

    def _savepoint_commit(self, sid: str) -> None:
        assert self.connection is not None
        self.connection.savepoint_commit(sid)
