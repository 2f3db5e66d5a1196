"""sqlqueue behind PgBouncer in transaction mode (PostgreSQL): publishers and
``runconsumer`` processes share fewer server sessions than they hold connections, and the
wake-up listener takes a direct address (``WAKEUP_LISTEN_DATABASES``), as the topologies
guide says to set it up. The PostgreSQL and the PgBouncer are the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from django.db import connection

from tests.acceptance.processes import FAST_LEASES, ROOT, runconsumer, wait_for
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


def server_sessions(server: PostgreSQL, database: str = DATABASE) -> tuple[int, int]:
    """(sessions of the database other than listeners, listening sessions), this
    query's own session left out."""
    counts = server.sql(
        "SELECT COUNT(*) FILTER (WHERE query NOT LIKE 'LISTEN%'), "
        "COUNT(*) FILTER (WHERE query LIKE 'LISTEN%') FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()", database)
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


# -- the default configuration: the runner's connection and its listener through the pool --
PACED = 60  # messages published one by one, for the latency figures
PACE = 0.05  # seconds between them
#: slow polls, so that a listener deaf behind the pool would show (the wave-3 trial:
#: p50 425 ms at POLL_INTERVAL=1 s, 24 ms with wake-ups off)
SLOW_POLLS = {"POLL_INTERVAL": 1, "VISIBILITY_TIMEOUT": 30}
POOLED_WARNING = "reaches the server through a connection pooler"


def publish_paced(url: str) -> None:
    """``PACED`` messages, each stamped with the (system-wide) monotonic clock it left at."""
    manage(url, "shell", "-c",
           "import time\nfrom sqlqueue import send_message\n"
           f"for n in range({PACED}):\n"
           "    send_message('accept.work', {'sent': time.monotonic()}, "
           "partition_key=f'p{n % 4}')\n"
           f"    time.sleep({PACE})")


def latency_p50_ms(server: PostgreSQL, database: str) -> float:
    """The median time from a message's publish to its handler's start, in ms (handlers
    journal ``time.monotonic()``, one clock for every process of the machine)."""
    return float(server.sql(
        "SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY h.at - "
        "(convert_from(m.payload, 'UTF8')::json->>'sent')::float) * 1000)::numeric, 1) "
        "FROM testapp_handlercall h JOIN queue_messages m ON m.\"offset\" = h.message_offset "
        "WHERE h.\"group\" = 'workers' AND h.event = 'started' AND h.attempt = 1",
        database))


def what_the_pool_hands_out(url: str) -> set[tuple[str, str, str]]:
    """(lock_timeout, application_name, channels listened to) of every server session
    of the pool, seen by an unrelated client: ``POOL_SIZE`` of them at once, each in a
    transaction (which holds a session), take them all."""
    import psycopg

    clients = [psycopg.connect(url) for _ in range(POOL_SIZE)]
    try:
        seen = set()
        for client in clients:
            row = client.execute(
                "SELECT current_setting('lock_timeout'), "
                "current_setting('application_name'), "
                "array_to_string(ARRAY(SELECT pg_listening_channels()), ','), "
                "pg_backend_pid()").fetchone()
            assert row is not None
            seen.add(row)
        assert len({pid for *_, pid in seen}) == POOL_SIZE, seen  # every session seen
        return {(lock, name, channels) for lock, name, channels, _ in seen}
    finally:
        for client in clients:
            client.close()


def warnings_of_check(url: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"], cwd=ROOT,
        text=True, capture_output=True, check=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
             "SQLQUEUE_JSON": "{}"})
    return result.stdout + result.stderr


def run_paced(processes: list, server: PostgreSQL, url: str, direct: str, name: str,
              settings: dict[str, object], listens: bool = True,
              ) -> tuple[subprocess.Popen[str], float]:
    """A runner on ``url`` (``direct``: the listener alias's address, when the settings
    name one) and ``PACED`` messages once it listens (``listens``) or has handled a first
    one; returns the runner and the p50 latency."""
    database = direct.rsplit("/", 1)[-1]
    runner = runconsumer("--group", "workers", "--name", name, settings=settings,
                         env={"DATABASE_URL": url, "SQLQUEUE_TEST_LISTEN_URL": direct})
    processes.append(runner)
    if listens:
        wait_for(lambda: server_sessions(server, database)[1] == 1, what=f"{name} listening")
    else:  # started and polling: a first message handled
        manage(url, "shell", "-c", "from sqlqueue import send_message; "
               "send_message('accept.work', {}, partition_key='warm-up')")
        wait_for(lambda: server.sql("SELECT COUNT(*) FROM testapp_handlercall WHERE "
                                    "event = 'finished'", database).strip() == "1",
                 what=f"{name} running")
    publish_paced(url)
    wait_for(lambda: int(server.sql(
        "SELECT COUNT(DISTINCT message_offset) FROM testapp_handlercall WHERE "
        "event = 'finished'", database)) >= PACED + (0 if listens else 1), timeout=60,
        what=name)
    return runner, latency_p50_ms(server, database)


def test_through_the_pool_the_listener_goes_past_it_and_nothing_is_inherited(
        processes: list) -> None:
    """Default settings through a transaction pool: the listener finds the pooler and
    listens on a session of its own straight to the server behind it (latency as direct:
    printed); no server session of the pool is left with sqlqueue's lock_timeout,
    application_name or LISTEN; ``check`` does not warn. Behind a pooler that reaches
    PostgreSQL through a Unix socket there is no address to reach: the listener stays
    off with one warning, the runner polls quickly (printed too), and ``check`` warns
    (W106) with the reason."""
    with own_postgresql() as server, own_pgbouncer(server, "transaction",
                                                   pool_size=POOL_SIZE) as bouncer, \
            own_pgbouncer(server, "transaction", pool_size=POOL_SIZE,
                          via_socket=True) as socket_bouncer:
        direct = migrated(server, DATABASE)
        pooled = bouncer.url(DATABASE)
        assert "sqlqueue.W106" not in warnings_of_check(pooled)  # the listener gets past
        runner, pooled_p50 = run_paced(processes, server, pooled, direct, "pooled",
                                       SLOW_POLLS)
        assert server_sessions(server)[1] == 1  # its own LISTEN session, direct
        assert what_the_pool_hands_out(pooled) == {("0", "", "")}
        figures = {"through PgBouncer (transaction mode), default settings": pooled_p50}
        for name, kind, settings in (
                ("PgBouncer on PostgreSQL's Unix socket, default settings (listener off)",
                 "socket", SLOW_POLLS),
                ("through PgBouncer, listener alias direct", "pooled",
                 {**SLOW_POLLS, "WAKEUP_LISTEN_DATABASES": {"default": "listen"}}),
                ("direct", "direct", SLOW_POLLS)):
            database = f"{DATABASE}_{len(figures)}"
            address = migrated(server, database)
            url = {"socket": socket_bouncer.url(database), "pooled": bouncer.url(database),
                   "direct": address}[kind]
            other, figures[name] = run_paced(processes, server, url, address,
                                             f"run{len(figures)}", settings,
                                             listens=kind != "socket")
            if kind == "socket":
                socket_runner = other
                assert "through a Unix socket" in warnings_of_check(url)  # W106
        print("\npublish-to-handler p50 at POLL_INTERVAL=1 s: " + "; ".join(
            f"{name} {p50} ms" for name, p50 in figures.items()))
        for process in (runner, socket_runner):
            process.terminate()
        logs = [process.communicate(timeout=30)[1] for process in (runner, socket_runner)]
        assert POOLED_WARNING not in logs[0], logs[0][-3000:]
        assert logs[1].count(POOLED_WARNING) == 1, logs[1][-3000:]
        assert "through a Unix socket" in logs[1]
        for pool in (bouncer, socket_bouncer):
            assert "got packet 'A' from server when not linked" not in pool.log()
