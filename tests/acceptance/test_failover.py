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
from tests.acceptance.processes import runconsumer, wait_for
from tests.acceptance.servers import (
    Forwarder,
    can_start_mariadb,
    manage,
    migrated,
    own_mariadb,
)

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.failover"


def journal_has(path: Path, line: str) -> bool:
    return path.exists() and line in path.read_text().splitlines()


def test_an_outcome_from_the_old_server_never_acks_a_new_message(
        processes: list, mysql_only: None, tmp_path: Path) -> None:
    if not can_start_mariadb():
        pytest.skip("needs mariadbd and mariadb-install-db, as root")
    name = connection.settings_dict["NAME"]
    journal = tmp_path / "journal"
    with own_mariadb(tmp_path / "replica") as replica:
        migrated(replica, name)
        proxy = Forwarder(int(connection.settings_dict["PORT"] or 3306))
        try:
            worker = runconsumer(
                "--group", "failover", "--threads", "2",
                settings={"VISIBILITY_TIMEOUT": 10, "POLL_INTERVAL": 0.05},
                env={"DATABASE_URL": f"mysql://root@127.0.0.1:{proxy.port}/{name}",
                     "SQLQUEUE_TEST_JOURNAL": str(journal)})
            processes.append(worker)
            send_message(TOPIC, {}, partition_key="q", id="filler")  # offsets above 1
            before = send_message(TOPIC, {"sleep": 4}, partition_key="p", id="before")
            wait_for(lambda: journal_has(journal, f"start before {before.offset}"),
                     what="the handler on the old server")
            # The replica was behind: it has the partition's earlier messages but never saw
            # that one, and will hand its offset out again.
            replica.sql("ALTER TABLE queue_messages AUTO_INCREMENT = "
                        f"{before.offset - 1}", name)
            earlier = publish_on(replica.port, name, "earlier")
            proxy.switch(replica.port)
            wait_for(lambda: journal_has(journal, f"end earlier {earlier}"),
                     what="the worker to serve the partition on the new server")
            wait_for(lambda: journal_has(journal, f"end before {before.offset}"),
                     what="the old handler to finish")
            # Give the worker a few polls to record (or drop) that outcome on the new
            # server before the message that reuses the offset arrives.
            time.sleep(1.5)
            after = publish_on(replica.port, name, "after")
            assert after == before.offset  # the offset is reused
            wait_for(lambda: journal_has(journal, f"end after {after}"), timeout=30,
                     what="the new message at the reused offset")
        finally:
            proxy.close()
    worker.terminate()
    _, err = worker.communicate(timeout=60)
    assert "database server changed" in err, err


def publish_on(port: int, name: str, message_id: str) -> int:
    """Publish a message of partition p on the promoted server (as the application does
    after the failover); returns its offset."""
    code = ("from sqlqueue import send_message; print(send_message("
            f"'accept.failover', {{}}, partition_key='p', id={message_id!r}).offset)")
    return int(manage(f"mysql://root@127.0.0.1:{port}/{name}", "shell", "-c", code).split()[-1])
