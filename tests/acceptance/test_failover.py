"""A failover under a running ``runconsumer`` (issue 15): the address it uses moves to
another server, which hands out again offsets the old one had used (an asynchronous
replica promoted while it was behind: its AUTO_INCREMENT continues from what it had).

A handler still running on the old server's delivery finishes after the move. Before the
fix its ack was written on the new server, against an offset that names another message
there, and that message was never delivered. Now the worker notices the new server (the
head query and every fence say which server answered), drops what it knew, and the
outcome of the old delivery with it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection

from sqlqueue import send_message
from tests.acceptance.histories import across_a_failover, history_env
from tests.acceptance.processes import runconsumer, wait_for
from tests.acceptance.servers import (
    Forwarder,
    can_start_mariadb,
    manage,
    migrated,
    own_mariadb,
)
from tests.history.checker import check, report
from tests.history.model import Fault, GroupConfig

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.failover"


def journal_has(path: Path, line: str) -> bool:
    return path.exists() and line in path.read_text().splitlines()


def wait_for_passes(liveness: Path, passes: int, what: str) -> None:
    """Until the worker's loop has turned ``passes`` more times (it touches its liveness
    file at each turn): counted in passes, not seconds, however slow the machine."""
    def touched() -> int | None:
        return liveness.stat().st_mtime_ns if liveness.exists() else None

    seen = {touched()}

    def turned() -> bool:
        seen.add(touched())
        return len(seen - {None}) > passes

    wait_for(turned, timeout=60, what=f"{passes} passes of the worker: {what}", interval=0.005)


def test_an_outcome_from_the_old_server_never_acks_a_new_message(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    name = connection.settings_dict["NAME"]
    journal, liveness = tmp_path / "journal", tmp_path / "alive"
    with own_mariadb(tmp_path / "replica") as replica:
        migrated(replica, name)
        proxy = Forwarder(int(connection.settings_dict["PORT"] or 3306))
        try:
            worker = runconsumer(
                "--group", "failover", "--threads", "2", "--liveness-file", str(liveness),
                settings={"VISIBILITY_TIMEOUT": 10, "POLL_INTERVAL": 0.05},
                env={"DATABASE_URL": f"mysql://root@127.0.0.1:{proxy.port}/{name}",
                     "SQLQUEUE_TEST_JOURNAL": str(journal), **history_env(tmp_path, "w0")})
            processes.append(worker)
            published: list[str] = []  # for the history: "ok id partition offset began ended"
            began = time.time() * 1000
            filler = send_message(TOPIC, {}, partition_key="q", id="filler")  # offsets above 1
            published.append(f"ok filler q {filler.offset} {began} {time.time() * 1000}")
            began = time.time() * 1000
            before = send_message(TOPIC, {"sleep": 4}, partition_key="p", id="before")
            published.append(f"ok before p {before.offset} {began} {time.time() * 1000}")
            wait_for(lambda: journal_has(journal, f"start before {before.offset}"),
                     what="the handler on the old server")
            # The replica was behind: it has the partition's earlier messages but never saw
            # that one, and will hand its offset out again.
            replica.sql("ALTER TABLE queue_messages AUTO_INCREMENT = "
                        f"{before.offset - 1}", name)
            began = time.time() * 1000
            earlier = publish_on(replica.port, name, "earlier")
            published.append(f"ok earlier p {earlier} {began} {time.time() * 1000}")
            switched_at = time.time() * 1000
            proxy.switch(replica.port)
            wait_for(lambda: journal_has(journal, f"end earlier {earlier}"),
                     what="the worker to serve the partition on the new server")
            wait_for(lambda: journal_has(journal, f"end before {before.offset}"),
                     what="the old handler to finish")
            # A few passes of the worker record (or drop) that outcome on the new server
            # before the message that reuses the offset arrives.
            wait_for_passes(liveness, 3, "the old outcome recorded or dropped")
            began = time.time() * 1000
            after = publish_on(replica.port, name, "after")
            published.append(f"ok after p {after} {began} {time.time() * 1000}")
            assert after == before.offset  # the offset is reused
            wait_for(lambda: journal_has(journal, f"end after {after}"), timeout=30,
                     what="the new message at the reused offset")
            worker.terminate()
            _, err = worker.communicate(timeout=60)
            # The history checker on the run (the failover: from the switch until the
            # old server's lease would have run out; the replica never had filler and
            # before: lost by the database, their offsets reused).
            history = across_a_failover(
                tmp_path, TOPIC, "failover", GroupConfig(visibility_ms=10_000),
                "\n".join(published), [Fault("failover", switched_at, switched_at + 40_000)],
                lambda statement: replica.sql(statement, name), 30_000, 10_000)
        finally:
            proxy.close()
    assert "database server changed" in err, err
    violations = check(history)
    assert violations == [], report(history, violations)
    assert {r.id for r in history.runs} >= {"before", "earlier", "after"}


def publish_on(port: int, name: str, message_id: str, topic: str = TOPIC) -> int:
    """Publish a message of partition p on the promoted server (as the application does
    after the failover); returns its offset."""
    code = ("from sqlqueue import send_message; print(send_message("
            f"{topic!r}, {{}}, partition_key='p', id={message_id!r}).offset)")
    return int(manage(f"mysql://root@127.0.0.1:{port}/{name}", "shell", "-c", code).split()[-1])


def test_an_atomic_handler_never_acks_on_the_server_it_was_not_delivered_by(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    """A7 of the wave-3 report (guarantee I16): two messages of one partition delivered on the
    old server, the second queued behind the first (one handler thread). The address
    moves to the promoted replica, which never had them: the first handler's connection
    is cut, and the second starts on a fresh connection, which reaches the replica while
    the runner's own thread is still in its reconnect backoff. Before the fix its
    transaction committed the ack there, and the new message that reuses its offset on
    the replica was treated as handled and never delivered. Now the handler's transaction
    finds another server than the delivery's and rolls back, its own write too."""
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    name = connection.settings_dict["NAME"]
    journal, liveness = tmp_path / "journal", tmp_path / "alive"
    topic = "accept.failover.atomic"
    with own_mariadb(tmp_path / "replica") as replica:
        migrated(replica, name)
        proxy = Forwarder(int(connection.settings_dict["PORT"] or 3306))
        try:
            worker = runconsumer(
                "--group", "failover-atomic", "--threads", "1",
                "--liveness-file", str(liveness),
                settings={"VISIBILITY_TIMEOUT": 30, "POLL_INTERVAL": 0.05},
                env={"DATABASE_URL": f"mysql://root@127.0.0.1:{proxy.port}/{name}",
                     "SQLQUEUE_TEST_JOURNAL": str(journal)})
            processes.append(worker)
            first = send_message(topic, {"busy": 30}, partition_key="p", id="b-1")
            queued = send_message(topic, {}, partition_key="p", id="b-2")
            wait_for(lambda: journal_has(journal, f"start b-1 {first.offset}"),
                     what="the first handler on the old server")
            # The replica never saw b-1 and b-2: it hands their offsets out again.
            replica.sql(f"ALTER TABLE queue_messages AUTO_INCREMENT = {first.offset}", name)
            proxy.switch(replica.port)
            wait_for(lambda: journal_has(journal, f"end b-2 {queued.offset}"),
                     what="the queued delivery to run on a connection to the replica")
            # Its transaction commits (before the fix) or rolls back right after the
            # journal's line, and its outcome is collected at a later pass.
            wait_for_passes(liveness, 3, "the queued delivery's transaction ended")
            reused = [publish_on(replica.port, name, f"c-{n}", topic) for n in (1, 2)]
            assert reused == [first.offset, queued.offset]  # the offsets are reused
            wait_for(lambda: journal_has(journal, f"end c-2 {queued.offset}"), timeout=30,
                     what="the new message at b-2's offset")
            calls = replica.sql("SELECT message_id FROM testapp_handlercall "
                                "ORDER BY message_id", name).split()
            assert "b-2" not in calls, calls  # rolled back with its ack
        finally:
            proxy.close()
    worker.terminate()
    _, err = worker.communicate(timeout=60)
    assert "was delivered by the database server" in err, err

