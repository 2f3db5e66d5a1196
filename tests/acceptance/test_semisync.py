"""A failover with semi-synchronous replication (issue 15): a primary and a replica of the
test's own, `AFTER_SYNC` (a commit returns only once the replica has the transaction).
Publishers and two groups of workers reach the primary through a forwarder (the address
a virtual IP or a proxy gives the application); the primary is killed with SIGKILL, the
replica promoted and the forwarder switched. Every message whose publish returned is on
the replica and is handled by both groups: nothing lost, nothing skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.processes import FAST_LEASES, ROOT, runconsumer, wait_for
from tests.acceptance.servers import (
    Forwarder,
    MariaDB,
    can_start_mariadb,
    migrated,
    own_mariadb,
)

DATABASE = "semisync_test"
REPLICATION = ("--log-bin=binlog", "--binlog-format=ROW", "--gtid-strict-mode=ON")

# Publishes until told to stop (a file appears), one message per autocommit
# send_message, printing each offset once its commit returned; on a database error
# (the failover) it waits a little and goes on, as an application with retries would.
PUBLISH = """
import os, time
from django.db import Error, connection
from sqlqueue import send_message
n = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    try:
        sent = send_message("accept.work", {"sleep": 0}, partition_key=f"p{n % 4}")
    except Error:
        connection.close()
        time.sleep(0.2)
        continue
    print(sent.offset, flush=True)
    n += 1
    time.sleep(0.01)
"""


def handled(server: MariaDB, group: str) -> set[int]:
    rows = server.sql("SELECT DISTINCT message_offset FROM testapp_handlercall "
                      f"WHERE `group` = '{group}' AND event = 'finished'", DATABASE)
    return {int(line) for line in rows.split()}


def replicate(primary: MariaDB, replica: MariaDB) -> None:
    replica.sql("SET GLOBAL rpl_semi_sync_slave_enabled = ON")
    replica.sql(f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary.port}, "
                "MASTER_USER = 'root', MASTER_USE_GTID = slave_pos")
    replica.sql("START SLAVE")
    primary.sql("SET GLOBAL rpl_semi_sync_master_enabled = ON")
    primary.sql("SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC")
    # Never fall back to asynchronous replication during the test (that loses commits).
    primary.sql("SET GLOBAL rpl_semi_sync_master_timeout = 600000")
    wait_for(lambda: "ON" in primary.sql("SHOW STATUS LIKE 'Rpl_semi_sync_master_status'"),
             what="semi-synchronous replication to start")


def test_a_semi_sync_failover_loses_and_skips_nothing(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    with own_mariadb(tmp_path / "primary", *REPLICATION) as primary, \
            own_mariadb(tmp_path / "replica", *REPLICATION) as replica:
        replicate(primary, replica)
        migrated(primary, DATABASE)
        proxy = Forwarder(primary.port)
        try:
            url = f"mysql://root@127.0.0.1:{proxy.port}/{DATABASE}"
            for name in ("w1", "w2"):
                processes.append(runconsumer("--name", name, settings=FAST_LEASES,
                                             env={"DATABASE_URL": url}))
            stop = tmp_path / "stop"
            env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
                   "PATH": "/usr/bin:/bin", "STOP_FILE": str(stop)}
            publisher = subprocess.Popen(
                [sys.executable, "manage.py", "shell", "-c", PUBLISH], cwd=ROOT,
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: len(handled(primary, "workers")) >= 100, timeout=60,
                     what="work on the primary")
            primary.stop()  # SIGKILL
            replica.sql("STOP SLAVE")
            replica.sql("RESET SLAVE ALL")
            proxy.switch(replica.port)
            wait_for(lambda: len(handled(replica, "workers")) >= 250, timeout=90,
                     what="work on the promoted replica")
            stop.touch()
            offsets, errors = publisher.communicate(timeout=60)
            assert publisher.returncode == 0, errors
            committed = {int(line) for line in offsets.splitlines() if line.isdigit()}
            on_replica = {int(line) for line in replica.sql(
                "SELECT `offset` FROM queue_messages WHERE topic = 'accept.work'",
                DATABASE).split()}
            collected = committed - on_replica  # garbage-collected once both groups finished
            for group in ("workers", "auditors"):
                try:
                    wait_for(lambda group=group: handled(replica, group) >= committed,
                             timeout=90, interval=0.5, what=f"{group} to handle every message")
                except AssertionError:
                    missing = sorted(committed - handled(replica, group))
                    raise AssertionError(
                        f"{group}: {len(missing)} of {len(committed)} committed messages "
                        f"never handled ({len(collected)} collected): {missing[:20]}"
                    ) from None
        finally:
            proxy.close()
    assert all(process.poll() is None for process in processes)
