"""PostgreSQL ``LISTEN``: a runner's daemon thread on a connection of its own (Django's
connections run transactions; a listening session must stay idle in autocommit), woken
by the ``pg_notify`` that publishing queues in its transaction (delivered at commit).

A ``LISTEN`` belongs to one server session. Behind a transaction pooler (PgBouncer's
``pool_mode = transaction``, RDS Proxy, ...) the session goes back to the pool after the
statement: the listener would hear nothing, and the pool's next clients would inherit the
subscription (and every notification). So before listening the thread asks whether its
connection reaches the server session directly (``reaches_server_directly``); when it
does not and no listener alias was configured for it (``WAKEUP_LISTEN_DATABASES``), it
logs a warning once and stays off: the runner never counts on it and keeps its quick
polls. A configured listener alias is trusted: a session-mode pool keeps one session per
client, and ``LISTEN`` works through it."""

from __future__ import annotations

from typing import Any

from django.db import connections

from sqlqueue.storage.sql.postgresql import STATEMENTS, reaches_server_directly
from sqlqueue.wakeups.listener import STOP_CHECK, ChannelOff, Listener

#: libpq TCP keepalives, unless the database's OPTIONS say otherwise: a connection lost
#: without a reset (a dead host, a dropped NAT entry) is noticed within about a minute,
#: with no statement sent on an idle connection.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3}
#: the ``application_name`` of a listening session, set once the session is known to be
#: the listener's own (a startup parameter would reach a pooled session too)
SESSION_NAME = "sqlqueue wake-ups"


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg ``connect()`` arguments for a listening session on ``alias``: Django's own
    (host, credentials, OPTIONS), in autocommit."""
    params: dict[str, Any] = dict(connections[alias].get_connection_params())
    for key, value in KEEPALIVES.items():
        params.setdefault(key, value)
    params["autocommit"] = True
    return params


def pooled_message(alias: str) -> str:
    """The warning of a listener that found a transaction pooler on ``alias``."""
    return (
        f"The PostgreSQL wake-up listener of database {alias!r} reaches the server through "
        "a connection pooler (the server session's pg_backend_pid() differs from the one "
        "the connection was told): a LISTEN there would hear nothing and stay behind on "
        "a pooled session. Wake-ups from other processes are off; runners poll quickly "
        "after traffic instead. Fix: add a database alias that connects straight to "
        "PostgreSQL (or through a session-mode pool) and set SQLQUEUE"
        f"['WAKEUP_LISTEN_DATABASES'] = {{{alias!r}: '<that alias>'}} ({{{alias!r}: "
        f"{alias!r}}} if {alias!r} itself is a session-mode pool).")


class PostgreSQLListener(Listener):
    channel = "PostgreSQL LISTEN"

    def __init__(self, params: dict[str, Any], *args: Any, alias: str = "default",
                 listener_alias: bool = False, **kwargs: Any) -> None:
        """``alias``: the queue's database (for the log); ``listener_alias``: ``params``
        are those of a listener alias the settings name (trusted behind a pooler)."""
        super().__init__(*args, **kwargs)
        self.params = params
        self.alias = alias
        self.listener_alias = listener_alias
        #: the listening session's server process id (None while not connected)
        self.backend_pid: int | None = None

    def listen(self) -> None:
        import psycopg

        with psycopg.connect(**self.params) as connection:
            direct = reaches_server_directly(connection.cursor(),
                                             connection.info.backend_pid)
            if not direct and not self.listener_alias:
                raise ChannelOff(pooled_message(self.alias))
            if "application_name" not in self.params:
                connection.execute(*STATEMENTS.name_session(SESSION_NAME))
            connection.execute(STATEMENTS.listen_wakeups()[0])  # no parameters
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
