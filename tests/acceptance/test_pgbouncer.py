"""sqlqueue behind PgBouncer in transaction mode (PostgreSQL): publishers and
``runconsumer`` processes share fewer server sessions than they hold connections, and the
wake-up listener takes a direct address (``WAKEUP_LISTEN_DATABASES``), as the topologies
guide says to set it up. The PostgreSQL and the PgBouncer are the test's own."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection

from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.acceptance.servers import (
    PostgreSQL,
    can_start_pgbouncer,
    manage,
    migrated,
    own_pgbouncer,
    own_postgresql,
)

DATABASE = "bouncer_test"
#: at most this many server sessions for all the clients of the database
POOL_SIZE = 3
BEFORE, WHILE = 200, 100  # published before the consumers start, then one by one


@pytest.fixture(autouse=True)
def postgresql_and_pgbouncer() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer pools PostgreSQL connections")
    if not can_start_pgbouncer():
        pytest.skip("needs /usr/sbin/pgbouncer, PostgreSQL 15's initdb and the postgres "
                    "user, as root")


def handled(server: PostgreSQL) -> tuple[int, int]:
    """(messages finished, finishes): equal when none was handled twice."""
    counts = server.sql("SELECT COUNT(DISTINCT message_offset), COUNT(*) FROM "
                        "testapp_handlercall WHERE \"group\" = 'workers' "
                        "AND event = 'finished'", DATABASE)
    distinct, total = counts.strip().split("|")
    return int(distinct), int(total)


def server_sessions(server: PostgreSQL) -> tuple[int, int]:
    """(sessions of the database other than listeners, listening sessions), this
    query's own session left out."""
    counts = server.sql(
        "SELECT COUNT(*) FILTER (WHERE query NOT LIKE 'LISTEN%'), "
        "COUNT(*) FILTER (WHERE query LIKE 'LISTEN%') FROM pg_stat_activity "
        f"WHERE datname = '{DATABASE}' AND pid <> pg_backend_pid()", DATABASE)
    others, listeners = counts.strip().split("|")
    return int(others), int(listeners)


def test_publish_and_consume_through_pgbouncer_in_transaction_mode(processes: list) -> None:
    with own_postgresql() as server, own_pgbouncer(server, "transaction",
                                                   pool_size=POOL_SIZE) as bouncer:
        direct = migrated(server, DATABASE)
        pooled = bouncer.url(DATABASE)
        manage(pooled, "shell", "-c",
               "from sqlqueue import OutgoingMessage, send_messages; "
               "send_messages('accept.work', [OutgoingMessage({'sleep': 0.005}, "
               f"partition_key=f'p{{n % 8}}') for n in range({BEFORE})])")
        settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": 30,
                    "WAKEUP_LISTEN_DATABASES": {"default": "listen"}}
        for name in ("one", "two"):
            processes.append(runconsumer(
                "--group", "workers", "--name", name, settings=settings,
                env={"DATABASE_URL": pooled, "SQLQUEUE_TEST_LISTEN_URL": direct}))
        sessions: list[int] = []  # the server sessions of the pool, at every look

        def looking(condition: Callable[[], bool]) -> Callable[[], bool]:
            def look() -> bool:
                sessions.append(server_sessions(server)[0])
                return condition()
            return look

        # Each runner's listener holds a session of its own, straight to the server.
        wait_for(looking(lambda: server_sessions(server)[1] == 2), what="both listeners")
        wait_for(looking(lambda: handled(server)[0] >= 20), what="some messages handled")
        # One transaction each (autocommit), through the pool, while the runners work.
        # The publisher sees the pooler and prepares nothing: the next transaction may
        # run on a server session that never prepared it.
        published = manage(
            pooled, "shell", "-c",
            "from django.db import connection\n"
            "from sqlqueue import send_message\n"
            "from sqlqueue.storage.sql.prepared import session_statements\n"
            f"for n in range({WHILE}): "
            "send_message('accept.work', {'sleep': 0.005}, partition_key=f'p{n % 8}')\n"
            "session = session_statements(connection.connection)\n"
            "print(session.direct, sorted(session.prepared))")
        assert published.split()[-2:] == ["False", "[]"], published
        wait_for(looking(lambda: handled(server)[0] >= BEFORE + WHILE), timeout=120,
                 what="every message handled")
        assert handled(server) == (BEFORE + WHILE, BEFORE + WHILE)  # each exactly once
        # The clients really took turns on the pool's few server sessions.
        clients = bouncer.log().count("login attempt")
        assert clients > 2 * POOL_SIZE and max(sessions) <= POOL_SIZE, (clients, sessions)
        dead = [p for p in processes if p.poll() is not None]
        assert not dead, "\n".join(p.communicate(timeout=10)[1] for p in dead)
        assert "ERROR" not in bouncer.log(), bouncer.log()[-3000:]
