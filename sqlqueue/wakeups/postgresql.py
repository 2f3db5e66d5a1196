"""PostgreSQL ``LISTEN``: a runner's daemon thread on a connection of its own (Django's
connections run transactions; a listening session must stay idle in autocommit), woken
by the ``pg_notify`` that publishing queues in its transaction (delivered at commit).

A ``LISTEN`` belongs to one server session. Behind a transaction pooler (PgBouncer's
``pool_mode = transaction``, RDS Proxy, ...) the session goes back to the pool after the
statement: the listener would hear nothing, and the pool's next clients would inherit the
subscription (and every notification). So before listening the thread asks whether its
connection reaches the server session directly (``reaches_server_directly``); when it
does not and no listener alias was configured for it (``WAKEUP_LISTEN_DATABASES``), it
connects past the pooler, straight to the server behind it (the address and port that
server answered the pooler on, with the alias's credentials), once it has checked that
this reaches the same server; when it cannot (a Unix socket behind the pooler, a
firewall, pg_hba), it logs a warning once and stays off: the runner never counts on it
and keeps its quick polls. A configured listener alias is trusted: a session-mode pool
keeps one session per client, and ``LISTEN`` works through it."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.db import connections

from sqlqueue.storage.sql.postgresql import STATEMENTS, reaches_server_directly, server_address
from sqlqueue.wakeups.listener import STOP_CHECK, ChannelOff, Listener

logger = logging.getLogger("sqlqueue.wakeups")

#: libpq TCP keepalives, unless the database's OPTIONS say otherwise: a connection lost
#: without a reset (a dead host, a dropped NAT entry) is noticed within about a minute,
#: with no statement sent on an idle connection.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3}
#: the ``application_name`` of a listening session, set once the session is known to be
#: the listener's own (a startup parameter would reach a pooled session too)
SESSION_NAME = "sqlqueue wake-ups"
#: seconds a connection past the pooler may take before the listener gives up on it
DIRECT_CONNECT_TIMEOUT = 3


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg ``connect()`` arguments for a listening session on ``alias``: Django's own
    (host, credentials, OPTIONS), in autocommit."""
    params: dict[str, Any] = dict(connections[alias].get_connection_params())
    for key, value in KEEPALIVES.items():
        params.setdefault(key, value)
    params["autocommit"] = True
    return params


def pooled_message(alias: str, why: str = "") -> str:
    """The warning of a listener that found a transaction pooler on ``alias`` and could
    not reach the server behind it (``why``)."""
    return (
        f"The PostgreSQL wake-up listener of database {alias!r} reaches the server through "
        "a connection pooler (the server session's pg_backend_pid() differs from the one "
        "the connection was told): a LISTEN there would hear nothing and stay behind on "
        f"a pooled session; {why or 'the server behind it cannot be reached directly'}. "
        "Wake-ups from other processes are off; runners poll quickly "
        "after traffic instead. Fix: add a database alias that connects straight to "
        "PostgreSQL (or through a session-mode pool) and set SQLQUEUE"
        f"['WAKEUP_LISTEN_DATABASES'] = {{{alias!r}: '<that alias>'}} ({{{alias!r}: "
        f"{alias!r}}} if {alias!r} itself is a session-mode pool).")


class PostgreSQLListener(Listener):
    channel = "PostgreSQL LISTEN"
    heartbeats = True

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

        with contextlib.ExitStack() as closing:
            connection = closing.enter_context(psycopg.connect(**self.params))
            if not self.listener_alias and not reaches_server_directly(
                    connection.cursor(), connection.info.backend_pid):
                connection = closing.enter_context(self._past_the_pooler(connection))
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
                    self.check_echo()  # after reading: a heartbeat heard is not missed
            finally:
                self.backend_pid = None

    def _past_the_pooler(self, pooled: Any) -> Any:
        direct = connect_past_pooler(self.params, pooled, self.alias)
        if not self.connections:  # once, not at each reconnect
            logger.info("The PostgreSQL wake-up listener of database %r reaches the server "
                        "through a connection pooler: it listens on a session of its own "
                        "straight to that server, at %s:%s (one idle connection per "
                        "runconsumer; SQLQUEUE['WAKEUP_LISTEN_DATABASES'] chooses another "
                        "address).", self.alias, direct.info.host, direct.info.port)
        return direct


def connect_past_pooler(params: dict[str, Any], pooled: Any, alias: str) -> Any:
    """A session straight to the server behind the pooler that ``pooled`` (a psycopg
    connection made with ``params``; closed here) goes through: where that server
    answered the pooler, checked to be the same server and a session of its own.
    ``ChannelOff`` (its text: the warning) when there is none."""
    import psycopg

    (identity,) = pooled.execute(STATEMENTS.server_identity()[0]).fetchone()
    pooled.close()  # back to the pool: nothing of the listener stays there
    address = server_address(str(identity))
    if address is None:
        raise _off(alias, "the pooler reaches the server through a Unix socket")
    host, port = address
    direct_params = {key: value for key, value in params.items()
                     if key not in ("hostaddr", "service")}
    direct_params.update(host=host, port=port, connect_timeout=DIRECT_CONNECT_TIMEOUT)
    try:
        direct = psycopg.connect(**direct_params)
    except psycopg.Error as exc:
        raise _off(alias, f"connecting straight to it at {host}:{port} failed "
                   f"({str(exc).strip()})") from exc
    same = (direct.execute(STATEMENTS.server_identity()[0]).fetchone() == (identity,)
            and reaches_server_directly(direct.cursor(), direct.info.backend_pid))
    if not same:
        direct.close()
        raise _off(alias, f"{host}:{port} is not the server behind it, seen from here")
    return direct


def _off(alias: str, why: str) -> ChannelOff:
    """The listener stays off: ``why`` it cannot reach the server behind the pooler."""
    off = ChannelOff(pooled_message(alias, why))
    off.why = why  # type: ignore[attr-defined]  # the check's words
    return off


def past_pooler_problem(alias: str) -> str | None:
    """Why a listener of ``alias`` (reached through a pooler) could not listen straight
    to the server behind it, or None when it can (for ``manage.py check``)."""
    import psycopg

    params = connection_params(alias)
    try:
        pooled = psycopg.connect(**params)
    except psycopg.Error as exc:
        return str(exc).strip()
    try:
        connect_past_pooler(params, pooled, alias).close()
    except ChannelOff as off:
        return str(getattr(off, "why", off))
    finally:
        pooled.close()
    return None
