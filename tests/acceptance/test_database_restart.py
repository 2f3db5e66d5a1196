"""Subscribers keep going through a database server restart. The server is the test's own
(``tests/acceptance/servers.py``), never the shared one, which other work may be using:
a PostgreSQL when the suite runs on PostgreSQL, a MariaDB otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.acceptance.servers import (
    MariaDB,
    PostgreSQL,
    can_start_mariadb,
    can_start_postgresql,
    manage,
    migrated,
    own_mariadb,
    own_postgresql,
)

DATABASE = "restart_test"
MESSAGES = 200


def finished(server: MariaDB | PostgreSQL) -> int:
    group = '"group"' if isinstance(server, PostgreSQL) else "`group`"
    return int(server.sql("SELECT COUNT(DISTINCT message_offset) FROM testapp_handlercall "
                          f"WHERE {group} = 'workers' AND event = 'finished'", DATABASE))


@contextlib.contextmanager
def own_server(tmp_path: Path) -> Iterator[MariaDB | PostgreSQL]:
    """A server of the vendor under test (MariaDB standing in for MySQL and SQLite)."""
    if connection.vendor == "postgresql":
        if not can_start_postgresql():
            pytest.skip(f"needs {PG_BIN_TEXT} and the postgres user, as root")
        with own_postgresql() as postgres:
            yield postgres
        return
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    with own_mariadb(tmp_path / "server") as mariadb:
        yield mariadb


PG_BIN_TEXT = "PostgreSQL 15's initdb"


def test_subscribers_recover_from_a_database_restart(processes: list, tmp_path: Path) -> None:
    with own_server(tmp_path) as server:
        url = migrated(server, DATABASE)
        manage(url, "shell", "-c",
               "from sqlqueue import OutgoingMessage, send_messages; "
               "send_messages('accept.work', [OutgoingMessage({'sleep': 0.02}, "
               f"partition_key=f'p{{n % 4}}') for n in range({MESSAGES})])")
        settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": 5}
        for name in ("one", "two"):
            processes.append(runconsumer("--group", "workers", "--name", name,
                                         settings=settings, env={"DATABASE_URL": url}))
        wait_for(lambda: finished(server) >= 20, what="some messages to be handled")
        server.restart()
        wait_for(lambda: finished(server) >= MESSAGES, timeout=120,
                 what="every message to be handled")
        dead = [p for p in processes if p.poll() is not None]
        assert not dead, "\n".join(p.communicate(timeout=10)[1] for p in dead)  # nobody died


def test_a_consumer_started_while_the_database_is_down_waits_for_it(
    processes: list, tmp_path: Path
) -> None:
    """Its start-up checks ask the server its version: a server still starting (or
    restarting) is waited for, not a traceback and exit 1."""
    with own_server(tmp_path) as server:
        url = migrated(server, DATABASE)
        manage(url, "shell", "-c",
               "from sqlqueue import send_messages; send_messages('accept.work', "
               "[{'sleep': 0} for n in range(10)])")
        server.stop()
        consumer = runconsumer("--group", "workers", "--until-empty", settings=FAST_LEASES,
                               env={"DATABASE_URL": url})
        processes.append(consumer)
        assert consumer.stderr is not None
        # MySQL's model checks ask the server its version (the checks wait); PostgreSQL's
        # connect to nothing, and the first to find the server away is the preflight,
        # after which the runner waits for it.
        waiting = consumer.stderr.readline()
        while ("not reachable yet" not in waiting
               and "Could not check the queue's database" not in waiting):
            assert waiting, "the consumer ended without saying it waits for the database"
            waiting = consumer.stderr.readline()
        server.start()
        wait_for(lambda: consumer.poll() is not None, timeout=60, what="the consumer to drain")
        assert consumer.returncode == 0, consumer.communicate()
        assert finished(server) == 10
