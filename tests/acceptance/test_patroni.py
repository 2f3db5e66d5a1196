"""A Patroni failover under load (issue 39): two PostgreSQL 15 nodes under Patroni with
etcd, all the test's own; the publisher and two ``runconsumer`` processes reach the
cluster through libpq's multi-host string (``target_session_attrs=read-write``), as the
topologies guide says to set it up. The primary is killed (Patroni and PostgreSQL,
``kill -9``: a dead machine) while messages flow, and one of the runners with it (it ran
on that machine); the replica is promoted.

Every message is counted: none acknowledged to the publisher is lost (Patroni's
``synchronous_mode``), none on the new primary is skipped. And delivery resumes within
seconds of the promotion: the first runner that reaches the new primary voids the leases,
heartbeats and deliveries the old one granted (sqlqueue.consuming.takeover), so the
surviving runner takes the dead one's partitions and deliveries at once, where it used
to wait them out (``LEASE_DURATION``, 30 s by default, and ``VISIBILITY_TIMEOUT``).
The figures are printed (``pytest -s``; ``make topologies``).

Needs Debian's ``patroni`` and ``etcd-server`` (not part of ``make test``: skipped with
the reason when they are missing)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.histories import history_env
from tests.acceptance.patroni import PatroniCluster, can_start_patroni, own_patroni
from tests.acceptance.processes import ROOT, runconsumer, wait_for
from tests.acceptance.servers import manage
from tests.history import lease_log
from tests.history.checker import check, report
from tests.history.model import Fault, GroupConfig, History, Publish, Run

DATABASE = "patroni_test"
TOPIC = "accept.patroni"
PARTITIONS = 8
#: the defaults (LEASE_DURATION 30 s, VISIBILITY_TIMEOUT 60 s), which the runners used
#: to wait out; garbage collection keeps every row (the new primary is the ground truth)
WORKER_SETTINGS = {"RETENTION": 3600}
#: delivery must resume this soon after the promotion (the issue's bar)
RESUME_WITHIN = 10.0
#: the workers' lease settings: the defaults (for the history's lease rules, I11/I12)
LEASE_MS, RENEW_MS = 30_000, 10_000

# About 40 messages a second over the partitions, one send_message per autocommit;
# prints "ok <id> <partition> <offset> <began ms> <ended ms>" once its commit returned,
# or "failed <id> <partition> - ..." on a database error (the failover: its commit may
# or may not have happened; the new primary says), then waits a little and goes on with
# the next id, as an application with retries would.
PUBLISH = f"""
import os, time
from django.db import Error, connection
from sqlqueue import send_message
n = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    n += 1
    partition, began = f"p{{n % {PARTITIONS}}}", time.time() * 1000
    try:
        offset = send_message({TOPIC!r}, {{}}, id=f"m{{n}}", partition_key=partition).offset
    except Error:
        print("failed", f"m{{n}}", partition, "-", began, time.time() * 1000, flush=True)
        connection.close()
        time.sleep(0.2)
        continue
    print("ok", f"m{{n}}", partition, offset, began, time.time() * 1000, flush=True)
    time.sleep(0.02)
"""

pytestmark = [pytest.mark.topology, pytest.mark.skipif(
    not can_start_patroni(),
    reason="needs Debian's patroni and etcd-server packages (make topologies installs "
           "them), PostgreSQL 15 and the postgres user, as root")]


def journal(paths: list[Path]) -> list[tuple[str, str, int, str, int, float, str]]:
    """(event, id, offset, partition, attempt, wall time, runner) of every handler call."""
    found = []
    for runner, path in enumerate(paths):
        if path.exists():
            for line in path.read_text().splitlines():
                event, message_id, offset, partition, attempt, at = line.split()
                found.append((event, message_id, int(offset), partition, int(attempt),
                              float(at), f"w{runner}"))
    return found


def ended(paths: list[Path]) -> set[tuple[str, int]]:
    return {(i, o) for event, i, o, *_ in journal(paths) if event == "end"}


def stored(cluster: PatroniCluster, node: int) -> set[tuple[str, int]]:
    rows = cluster.sql(node, 'SELECT id, "offset" FROM queue_messages '
                             f"WHERE topic = '{TOPIC}'", DATABASE)
    return {(i, int(o)) for i, o in (line.split("|") for line in rows.splitlines() if line)}


def history_of(published: str, calls: list[tuple[str, str, int, str, int, float, str]],
               cluster: PatroniCluster, node: int, fault: Fault, folder: Path) -> History:
    """The run as the history checker reads it (tests/history): the publishes (one whose
    commit failed counts as committed if the new primary has it: the database decides an
    in-doubt commit), every handler call, the workers' lease events (their files in
    ``folder``: tests/acceptance/histories.py), the failover, and the new primary's
    state."""
    stored_ids = dict(stored(cluster, node))
    publishes = []
    for line in published.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[0] not in ("ok", "failed"):
            continue
        kind, message_id, partition, offset, began, ended = fields
        committed = kind == "ok" or message_id in stored_ids
        publishes.append(Publish(
            "publisher", TOPIC, partition, message_id,
            int(offset) if kind == "ok" else stored_ids.get(message_id), float(began),
            float(began), float(ended), committed))
    starts = {(c[1], c[4], c[6]): c for c in calls if c[0] == "start"}
    ends = {(c[1], c[4], c[6]): c for c in calls if c[0] == "end"}
    runs = [Run("patroni", TOPIC, partition, offset, message_id, attempt, runner,
                at * 1000, ends[key][5] * 1000 if key in ends else None,
                "ok" if key in ends else "cut")
            for key, (_, message_id, offset, partition, attempt, at, runner) in starts.items()]
    history = History(TOPIC, {"patroni": GroupConfig(visibility_ms=60_000)},
                      publishes=publishes, runs=runs, faults=[fault],
                      lease_ms=LEASE_MS, renew_ms=RENEW_MS)
    lease_log.read_lines(sorted(folder.glob("leases-*.jsonl")), history)
    offsets = {p: int(o) for p, o in (line.split("|") for line in cluster.sql(
        node, "SELECT partition_key, offset_acked FROM queue_offsets WHERE "
        f"consumer_group = 'patroni' AND topic = '{TOPIC}'", DATABASE).splitlines())}
    acked = {(p, int(o)) for p, o in (line.split("|") for line in cluster.sql(
        node, "SELECT partition_key, message_offset FROM queue_delivery_state WHERE "
        f"consumer_group = 'patroni' AND topic = '{TOPIC}' AND acked", DATABASE).splitlines())}
    partition_of = {p.id: p.partition for p in publishes}
    history.final.stored = {(partition_of.get(i, ""), o): i for i, o in stored_ids.items()}
    history.final.acked = {("patroni", p, o) for p, o in history.final.stored
                           if (p, o) in acked or o <= offsets.get(p, 0)}
    return history


def test_a_patroni_failover_loses_and_skips_nothing_and_resumes_within_seconds(
        processes: list, tmp_path: Path) -> None:
    journals = [tmp_path / f"journal-{n}" for n in range(2)]
    with own_patroni(size=2, synchronous=True) as cluster:
        cluster.sql(0, f'CREATE DATABASE "{DATABASE}"')
        url = cluster.url(DATABASE)
        manage(url, "migrate", "-v", "0")
        for n, path in enumerate(journals):
            processes.append(runconsumer(
                "--group", "patroni", "--threads", "4", "--name", f"w{n}",
                settings=WORKER_SETTINGS,
                env={"DATABASE_URL": url, "SQLQUEUE_TEST_JOURNAL": str(path),
                     **history_env(tmp_path, f"w{n}")}))
        stop = tmp_path / "stop"
        publisher = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", PUBLISH], cwd=ROOT,
            env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
                 "PATH": "/usr/bin:/bin", "STOP_FILE": str(stop)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(publisher)
        wait_for(lambda: len(ended(journals)) >= 300, timeout=90, what="work on node0")
        killed_at = time.time()
        cluster.kill(0)
        processes[0].kill()  # w0 ran on node0's machine
        wait_for(lambda: cluster.leader() == 1, timeout=60, interval=0.1,
                 what="Patroni to promote node1")
        promoted_at = time.time()
        kept_at_failover = len(stored(cluster, 1))
        wait_for(lambda: len(stored(cluster, 1)) >= kept_at_failover + 300, timeout=90,
                 what="publishing on the promoted node")
        stop.touch()
        published, errors = publisher.communicate(timeout=60)
        assert publisher.returncode == 0, errors
        acked = {(fields[1], int(fields[3])) for fields in
                 (line.split() for line in published.splitlines()) if fields[:1] == ["ok"]}
        surviving = stored(cluster, 1)
        try:
            wait_for(lambda: surviving <= ended(journals), timeout=120, interval=0.5,
                     what="every message on the new primary to be handled")
        except AssertionError:
            skipped = sorted(surviving - ended(journals), key=lambda m: m[1])
            raise AssertionError(f"{len(skipped)} of {len(surviving)} messages on the new "
                                 f"primary never handled: {skipped[:20]}") from None
        survivor = processes[1]
        survivor.terminate()
        log = survivor.communicate(timeout=60)[1]
        calls = journal(journals)
        # The failover, from the kill until delivery had to be back.
        history = history_of(published, calls, cluster, 1, Fault(
            "failover", killed_at * 1000, (promoted_at + RESUME_WITHIN) * 1000), tmp_path)
        history.faults.append(Fault("kill", killed_at * 1000, killed_at * 1000, "w0"))
    violations = check(history)
    assert not violations, report(history, violations)
    lost = acked - surviving
    # When each partition was first served again: a handler started on a delivery of
    # the new primary (the old one is dead: any start after the promotion is one).
    resumed = {}
    for event, _, _, partition, _, at, _ in sorted(calls, key=lambda call: call[5]):
        if event == "start" and at > promoted_at and partition not in resumed:
            resumed[partition] = at - promoted_at
    redelivered = sum(1 for c in calls if c[0] == "start" and c[4] > 1)
    duplicates = len([c for c in calls if c[0] == "end"]) - len(ended(journals))
    print(f"\nPatroni, 2 nodes, synchronous_mode, kill -9 of the primary and of one of two "
          "runners under load: "
          f"promoted {promoted_at - killed_at:.1f} s after the kill; published "
          f"{len(acked)} (acked to the publisher), on the new primary {len(surviving)}, "
          f"acked but lost {len(lost)}, handled {len(surviving & ended(journals))} of "
          f"{len(surviving)} (skipped 0), handled twice {duplicates}, attempts > 1 "
          f"{redelivered}; delivery resumed {min(resumed.values()):.1f} s after the "
          f"promotion, every partition served again within {max(resumed.values()):.1f} s; "
          f"history checked: {len(history.publishes)} publishes, {len(history.runs)} runs, "
          f"{len(history.leases)} lease events, 0 violations")
    assert not lost, sorted(lost, key=lambda m: m[1])[:20]
    assert len(resumed) == PARTITIONS, resumed
    assert max(resumed.values()) <= RESUME_WITHIN, resumed
    assert "database server changed" in log, log[-3000:]
