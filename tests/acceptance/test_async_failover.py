"""Failovers to a replica that was behind (issue 15, the report's runs A4 and A3c): the
replica stopped receiving the primary's binlog 3 s before the primary died, either with
asynchronous replication or with semi-synchronous replication that timed out to
asynchronous. What the primary committed in those 3 s is gone (asynchronous replication
loses it before sqlqueue can see it), and the promoted replica hands those offsets out
again. Handlers that do not touch the database (1.5 s each, like an API call) are still
running on the old primary's deliveries when the worker's connection moves.

Before the fix, their acks could land on the new server against offsets that named other
messages there, and those messages were never delivered: 8 and 2 of 1,678 in the report.
That takes a race (an old handler's ack on a reused offset of the same partition, under a
lease the replica still has), which tests/acceptance/test_failover.py reproduces
deterministically. This test re-runs the report's scenarios end to end and counts every
message: each one on the surviving database is handled, 0 skipped. The figures of each
run are printed (``pytest -s``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.histories import across_a_failover, history_env
from tests.acceptance.processes import ROOT, runconsumer, wait_for
from tests.acceptance.servers import (
    Forwarder,
    MariaDB,
    can_start_mariadb,
    migrated,
    own_mariadb,
)
from tests.history.checker import check, report
from tests.history.model import Fault, GroupConfig

# Two servers of the test's own and a failover, a minute each: make topologies (pyproject.toml).
pytestmark = pytest.mark.topology
DATABASE = "async_failover_test"
TOPIC = "accept.failover"
REPLICATION = ("--log-bin=binlog", "--binlog-format=ROW", "--gtid-strict-mode=ON")
LAG_SECONDS = 3
# Leases outlive the lag, so the promoted replica still has them under the same
# generation (fencing by generation cannot tell the servers apart: only the server's
# identity can). Garbage collection keeps every row: the surviving database is the
# ground truth.
WORKER_SETTINGS = {"LEASE_DURATION": 10, "LEASE_RENEW_INTERVAL": 2, "POLL_INTERVAL": 0.05,
                   "VISIBILITY_TIMEOUT": 10, "RETENTION": 3600}

# 40 messages a second over 8 partitions, one send_message per autocommit; prints
# "<id> <offset>" once its commit returned; on a database error (the failover) it waits
# a little and goes on with the next id, as an application with retries would.
PUBLISH = """
import json, os, random, time
from django.db import Error, connection
from sqlqueue import send_message
payload = json.loads(os.environ["PAYLOAD"])
n = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    n += 1
    partition, began = f"p{random.randrange(8)}", time.time() * 1000
    try:
        sent = send_message("accept.failover", payload, id=f"m{n}", partition_key=partition)
    except Error:
        print("failed", f"m{n}", partition, "-", began, time.time() * 1000, flush=True)
        connection.close()
        time.sleep(0.2)
        continue
    print(sent.id, sent.offset, flush=True)
    print("ok", sent.id, partition, sent.offset, began, time.time() * 1000, flush=True)
    time.sleep(0.025)
"""


def ended(journals: list[Path]) -> set[tuple[str, int]]:
    """(id, offset) of every handler call that finished, from the workers' own files."""
    found = set()
    for path in journals:
        if path.exists():
            for line in path.read_text().splitlines():
                event, message_id, offset = line.split()
                if event == "end":
                    found.add((message_id, int(offset)))
    return found


def stored(server: MariaDB) -> set[tuple[str, int]]:
    rows = server.sql(f"SELECT id, `offset` FROM queue_messages WHERE topic = '{TOPIC}'",
                      DATABASE)
    return {(message_id, int(offset)) for message_id, offset in
            (line.split() for line in rows.splitlines() if line.strip())}


def replicate(primary: MariaDB, replica: MariaDB, semi_sync: bool) -> None:
    if semi_sync:
        replica.sql("SET GLOBAL rpl_semi_sync_slave_enabled = ON")
    replica.sql(f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary.port}, "
                "MASTER_USER = 'root', MASTER_USE_GTID = slave_pos")
    replica.sql("START SLAVE")
    if semi_sync:
        primary.sql("SET GLOBAL rpl_semi_sync_master_enabled = ON")
        primary.sql("SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC")
        primary.sql("SET GLOBAL rpl_semi_sync_master_timeout = 1000")  # falls back in 1 s
        wait_for(lambda: "ON" in primary.sql(
            "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'"),
            what="semi-synchronous replication to start")


def replica_caught_up(primary: MariaDB, replica: MariaDB) -> bool:
    """The replica has applied everything the primary has written (GTID positions)."""
    written = primary.sql("SELECT @@gtid_binlog_pos").split()[-1]
    return written in replica.sql("SELECT @@gtid_slave_pos")


def promote(replica: MariaDB) -> None:
    """What a failover tool does: apply what the replica received, then make it a
    primary. What it never received stays lost."""
    replica.sql("STOP SLAVE IO_THREAD")
    wait_for(lambda: "Slave has read all relay log" in replica.sql("SHOW SLAVE STATUS\\G"),
             timeout=30, what="the replica to apply its relay log")
    replica.sql("STOP SLAVE")
    replica.sql("RESET SLAVE ALL")


# The report's runs: A4 (async, 3 s behind, 1.5 s handlers that do not touch the
# database), A3c (semi-sync that timed out to async), and as soak runs (make topologies)
# A1a (async, not behind) and A1b (async, 3 s behind, handlers that write to the database).
RUNS = [
    pytest.param(False, LAG_SECONDS, {"sleep": 1.5}, id="async"),
    pytest.param(True, LAG_SECONDS, {"sleep": 1.5}, id="semi-sync-timed-out"),
    pytest.param(False, 0, {"sleep": 1.5}, id="async-not-behind", marks=pytest.mark.soak),
    pytest.param(False, LAG_SECONDS, {"sleep": 0.2, "touch_db": True},
                 id="async-handlers-write-to-the-db", marks=pytest.mark.soak),
]


@pytest.mark.parametrize(("semi_sync", "lag", "payload"), RUNS)
def test_a_failover_to_a_lagging_replica_skips_nothing_it_kept(
        processes: list, mysql_only: None, tmp_path: Path, semi_sync: bool, lag: int,
        payload: dict[str, object]) -> None:
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    journals = [tmp_path / f"journal-{n}" for n in range(2)]
    with own_mariadb(tmp_path / "primary", *REPLICATION) as primary, \
            own_mariadb(tmp_path / "replica", *REPLICATION) as replica:
        replicate(primary, replica, semi_sync)
        migrated(primary, DATABASE)
        proxy = Forwarder(primary.port)
        try:
            url = f"mysql://root@127.0.0.1:{proxy.port}/{DATABASE}"
            for n, path in enumerate(journals):
                processes.append(runconsumer(
                    "--group", "failover", "--threads", "8", "--name", f"w{n}",
                    settings=WORKER_SETTINGS,
                    env={"DATABASE_URL": url, "SQLQUEUE_TEST_JOURNAL": str(path),
                         **history_env(tmp_path, f"w{n}")}))
            stop = tmp_path / "stop"
            publisher = subprocess.Popen(
                [sys.executable, "manage.py", "shell", "-c", PUBLISH], cwd=ROOT,
                env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
                     "PATH": "/usr/bin:/bin", "STOP_FILE": str(stop),
                     "PAYLOAD": json.dumps(payload)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: len(ended(journals)) >= 100, timeout=90,
                     what="work on the primary")
            # The replica falls behind: it stops receiving the binlog. The lag is the
            # scenario itself, so it is a fixed time, not a condition to wait for.
            if lag:
                replica.sql("STOP SLAVE IO_THREAD")
                time.sleep(lag)
            else:  # caught up: what the primary committed is all there
                wait_for(lambda: replica_caught_up(primary, replica), timeout=30,
                         what="the replica to catch up")
            failed_at = time.time() * 1000
            primary.stop()  # SIGKILL
            promote(replica)
            proxy.switch(replica.port)
            switched_at = time.time() * 1000
            kept_at_failover = len(stored(replica))
            wait_for(lambda: len(stored(replica)) >= kept_at_failover + 200, timeout=90,
                     what="publishing on the promoted replica")
            stop.touch()
            published, errors = publisher.communicate(timeout=60)
            assert publisher.returncode == 0, errors
            acked = {(i, int(o)) for i, o in (line.split() for line in published.splitlines()
                                              if re.fullmatch(r"m\d+ \d+", line))}
            surviving = stored(replica)
            try:
                wait_for(lambda: surviving <= ended(journals), timeout=90, interval=0.5,
                         what="every message on the surviving database to be handled")
            except AssertionError:
                skipped = sorted(surviving - ended(journals), key=lambda m: m[1])
                raise AssertionError(f"{len(skipped)} of {len(surviving)} messages on the "
                                     f"surviving database never handled: {skipped[:20]}"
                                     ) from None
            # The history checker on the run: the failover, from the primary's death
            # until the workers' leases of the old server could have run out.
            history = across_a_failover(
                tmp_path, TOPIC, "failover", GroupConfig(
                    max_attempts=5, visibility_ms=WORKER_SETTINGS["VISIBILITY_TIMEOUT"] * 1000),
                published, [Fault("failover", failed_at, switched_at + 1000 * (
                    WORKER_SETTINGS["LEASE_DURATION"] + WORKER_SETTINGS["LEASE_RENEW_INTERVAL"]))],
                lambda statement: replica.sql(statement, DATABASE),
                WORKER_SETTINGS["LEASE_DURATION"] * 1000,
                WORKER_SETTINGS["LEASE_RENEW_INTERVAL"] * 1000)
        finally:
            proxy.close()
    violations = check(history)
    assert violations == [], report(history, violations)
    lost = acked - surviving
    reused = {offset for _, offset in lost} & {offset for _, offset in surviving}
    print(f"\n{'semi-sync timed out' if semi_sync else 'async'}, {lag} s lag, "
          f"handlers {'writing to' if payload.get('touch_db') else 'not touching'} the db: "
          f"published {len(acked)} (acked to the publisher), on the new primary "
          f"{len(surviving)}, acked but lost {len(lost)}, offsets reused {len(reused)}, "
          f"handled {len(surviving & ended(journals))} of {len(surviving)}, skipped 0; "
          f"history checked: {len(history.publishes)} publishes, {len(history.runs)} runs, "
          f"{len(history.leases)} lease events, 0 violations")
    if lag:
        assert lost, "the replica was meant to be behind: the scenario did not happen"
        assert reused, "the promoted replica was meant to hand out lost offsets again"
    assert all(process.poll() is None for process in processes)
