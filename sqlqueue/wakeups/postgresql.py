"""PostgreSQL ``LISTEN``: a runner's daemon thread on a connection of its own (Django's
connections run transactions; a listening session must stay idle in autocommit), woken
by the ``pg_notify`` that publishing queues in its transaction (delivered at commit)."""

from __future__ import annotations

from typing import Any

from django.db import connections

from sqlqueue.storage.sql.postgresql import listen_wakeups_sql
from sqlqueue.wakeups.listener import STOP_CHECK, Listener

#: libpq TCP keepalives, unless the database's OPTIONS say otherwise: a connection lost
#: without a reset (a dead host, a dropped NAT entry) is noticed within about a minute,
#: with no statement sent on an idle connection.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3}


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg ``connect()`` arguments for a listening session on ``alias``: Django's own
    (host, credentials, OPTIONS), in autocommit."""
    params: dict[str, Any] = dict(connections[alias].get_connection_params())
    for key, value in KEEPALIVES.items():
        params.setdefault(key, value)
    params.setdefault("application_name", "sqlqueue wake-ups")
    params["autocommit"] = True
    return params


class PostgreSQLListener(Listener):
    channel = "PostgreSQL LISTEN"

    def __init__(self, params: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params = params
        #: the listening session's server process id (None while not connected)
        self.backend_pid: int | None = None

    def listen(self) -> None:
        import psycopg

        with psycopg.connect(**self.params) as connection:
            connection.execute(listen_wakeups_sql())
            self.backend_pid = connection.info.backend_pid
            self.listening()
            try:
                while not self.stopping.is_set():
                    # Waits on the socket: no statement while idle. A terminated session
                    # raises here (OperationalError), and run() reconnects.
                    for notification in connection.notifies(timeout=STOP_CHECK):
                        self.heard(notification.payload)
            finally:
                self.backend_pid = None
