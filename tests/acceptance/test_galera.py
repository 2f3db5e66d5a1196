"""A Galera cluster of the test's own (issue 15): publishers on node 1 whose transactions
stay open after their INSERT, workers of two groups on node 3. A node's INNODB_TRX shows
only its own transactions, so a worker on node 3 cannot see node 1's publishers; before
the fix its watermark passed their offsets and those messages were never delivered (24
and 26 of 2,270 in the study). Now the horizon assumes MAX_TRANSACTION_AGE on Galera
(check sqlqueue.W110) and every message is delivered to both groups.

Then two nodes publish the same ids at the same moment, outside any transaction: each id
is stored once and the losing publisher gets ``created=False``, not a deadlock error."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.processes import FAST_LEASES, ROOT, runconsumer, wait_for
from tests.acceptance.servers import (
    Forwarder,
    GaleraCluster,
    MariaDB,
    can_start_galera,
    own_galera,
)

# A three-node cluster of the test's own: make topologies (pyproject.toml).
pytestmark = pytest.mark.topology
DATABASE = "galera_test"
SECONDS = 20

# Two "slow" publishers: each transaction publishes, then does 1.5 s of other work before
# it commits (an outbox-style block), so its offsets commit after later ones; and one fast
# publisher at about 50 messages a second. Random partitions over 8 keys.
PUBLISH = f"""
import random, time
from django.db import transaction
from sqlqueue import send_message
slow = {{slow}}
end = time.monotonic() + {SECONDS}
while time.monotonic() < end:
    with transaction.atomic():
        for n in range(3 if slow else 1):
            key = f"p{{{{random.randrange(8)}}}}"
            print(send_message("accept.work", {{{{"sleep": 0}}}}, partition_key=key).offset)
        time.sleep(1.5 if slow else 0.02)
"""


def handled(cluster: GaleraCluster, group: str) -> set[int]:
    rows = cluster.nodes[2].sql(
        "SELECT DISTINCT message_offset FROM testapp_handlercall "
        f"WHERE `group` = '{group}' AND event = 'finished'", DATABASE)
    return {int(line) for line in rows.split()}


def test_workers_on_another_node_than_the_publishers_skip_nothing(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    if not can_start_galera():
        pytest.skip("needs mariadbd, mariadb-install-db and galera-4, as root")
    with own_galera(tmp_path / "galera", DATABASE) as cluster:
        publisher_url, worker_url = (cluster.nodes[0].url(DATABASE),
                                     cluster.nodes[2].url(DATABASE))
        # Watermarks may pass an offset 3 s after the worker saw the head: longer than any
        # publishing transaction here (1.5 s), far shorter than the test.
        settings = {**FAST_LEASES, "MAX_TRANSACTION_AGE": 3}
        for name in ("w1", "w2"):
            processes.append(runconsumer("--name", name, settings=settings,
                                         env={"DATABASE_URL": worker_url}))
        env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": publisher_url,
               "PATH": "/usr/bin:/bin"}
        publishers = [subprocess.Popen([sys.executable, "manage.py", "shell", "-c",
                                        PUBLISH.format(slow=slow)],
                                       cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                      for slow in (True, True, False)]
        expected: set[int] = set()
        for publisher in publishers:
            offsets, errors = publisher.communicate(timeout=120)
            assert publisher.returncode == 0, errors
            expected |= {int(line) for line in offsets.splitlines() if line.isdigit()}
        assert len(expected) > 300, len(expected)
        for group in ("workers", "auditors"):
            try:
                wait_for(lambda group=group: handled(cluster, group) >= expected, timeout=120,
                         interval=0.5, what=f"{group} to handle every message")
            except AssertionError:
                skipped = sorted(expected - handled(cluster, group))
                raise AssertionError(f"{group} never handled {len(skipped)} of "
                                     f"{len(expected)} messages: {skipped[:20]}") from None
        assert all(process.poll() is None for process in processes)
        _same_ids_on_two_nodes(cluster)


# Each publishes the same 200 ids, one send_message each outside any transaction of its
# own, starting at the same moment on its node; prints "<id> <created> <offset>".
RACE = """
import os, time
from sqlqueue import send_message
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
for n in range(200):
    sent = send_message("accept.race", {"n": n}, partition_key=f"p{n % 4}", id=f"dup-{n}")
    print(sent.id, int(sent.created), sent.offset, flush=True)
"""


def _same_ids_on_two_nodes(cluster: GaleraCluster) -> None:
    """Two nodes storing the same id at once: Galera's certification lets one commit and
    rolls the other back as a deadlock victim (1213). Outside a transaction of the
    caller's, sqlqueue tries the loser again, which then finds the winner's row: one
    message per id, ``created=False`` for the other publisher, no error."""
    start_at = str(time.time() + 5)  # both processes have started Django by then
    racers = [subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", RACE], cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin",
             "DATABASE_URL": node.url(DATABASE), "START_AT": start_at},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in cluster.nodes[:2]]
    answers: dict[str, list[tuple[int, int]]] = {}
    for racer in racers:
        out, errors = racer.communicate(timeout=120)
        assert racer.returncode == 0, errors[-3000:]
        for line in out.splitlines():
            if line.startswith("dup-"):
                message_id, created, offset = line.split()
                answers.setdefault(message_id, []).append((int(created), int(offset)))
    assert len(answers) == 200
    for message_id, both in answers.items():
        assert sorted(created for created, _ in both) == [0, 1], (message_id, both)
        assert len({offset for _, offset in both}) == 1, (message_id, both)
    stored = cluster.nodes[2].sql(
        "SELECT COUNT(*) FROM queue_messages WHERE topic = 'accept.race'", DATABASE)
    assert int(stored.split()[-1]) == 200


@pytest.mark.soak  # make topologies: the report's run with every client on one node
def test_a_single_writer_moved_to_another_node_skips_nothing(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    """Every publisher and worker on node 1 (the recommended single-writer layout), node 1
    killed under traffic, the address moved to node 2: every message node 2 has is
    handled (what node 1 committed was certified on every node: nothing is lost)."""
    if not can_start_galera():
        pytest.skip("needs mariadbd, mariadb-install-db and galera-4, as root")
    journal = tmp_path / "journal"
    with own_galera(tmp_path / "galera", DATABASE) as cluster:
        proxy = Forwarder(cluster.nodes[0].port)
        try:
            url = f"mysql://root@127.0.0.1:{proxy.port}/{DATABASE}"
            processes.append(runconsumer(
                "--group", "failover", "--threads", "8",
                # Galera's horizon is MAX_TRANSACTION_AGE: short, so that the watermark
                # the worker finds on node 2 is seconds behind, not minutes (all of it
                # would run again first).
                settings={**FAST_LEASES, "VISIBILITY_TIMEOUT": 10, "RETENTION": 3600,
                          "MAX_TRANSACTION_AGE": 3},
                env={"DATABASE_URL": url, "SQLQUEUE_TEST_JOURNAL": str(journal)}))
            stop = tmp_path / "stop"
            publisher = subprocess.Popen(
                [sys.executable, "manage.py", "shell", "-c", RELENTLESS], cwd=ROOT,
                env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
                     "PATH": "/usr/bin:/bin", "STOP_FILE": str(stop)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: _ended(journal) >= 100, timeout=90, what="work on node 1")
            cluster.nodes[0].stop()  # SIGKILL
            proxy.switch(cluster.nodes[1].port)
            at_switch = _stored(cluster.nodes[1])
            wait_for(lambda: len(_stored(cluster.nodes[1])) >= len(at_switch) + 200,
                     timeout=90, what="publishing on node 2")
            stop.touch()
            published, errors = publisher.communicate(timeout=60)
            assert publisher.returncode == 0, errors
            acked = {line.split()[0] for line in published.splitlines()
                     if line.startswith("m")}
            surviving = _stored(cluster.nodes[1])
            wait_for(lambda: surviving <= _ended_ids(journal), timeout=90, interval=0.5,
                     what="every message on node 2 to be handled")
        finally:
            proxy.close()
    print(f"\nGalera single writer, node 1 killed: published {len(acked)}, on node 2 "
          f"{len(surviving)}, lost {len(acked - surviving)}, skipped 0")
    assert acked <= surviving  # certified on every node before the publish returned


# Publishes one message per autocommit send_message to accept.failover, 0.5 s handlers,
# printing each id once its commit returned; on an error (the failover) it goes on.
RELENTLESS = """
import os, random, time
from django.db import Error, connection
from sqlqueue import send_message
n = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    n += 1
    try:
        send_message("accept.failover", {"sleep": 0.5}, id=f"m{n}",
                     partition_key=f"p{random.randrange(8)}")
    except Error:
        connection.close()
        time.sleep(0.2)
        continue
    print(f"m{n}", flush=True)
    time.sleep(0.025)
"""


def _ended_ids(journal: Path) -> set[str]:
    if not journal.exists():
        return set()
    return {line.split()[1] for line in journal.read_text().splitlines()
            if line.startswith("end ")}


def _ended(journal: Path) -> int:
    return len(_ended_ids(journal))


def _stored(node: MariaDB) -> set[str]:
    rows = node.sql("SELECT id FROM queue_messages WHERE topic = 'accept.failover'", DATABASE)
    return {line.strip() for line in rows.splitlines() if line.strip()}
