"""Subscribers keep going through a database server restart (MariaDB/MySQL on this host)."""

from __future__ import annotations

import os
import shutil

import pytest
from django.db import connection

from sqlqueue import OutgoingMessage, send_messages
from tests.acceptance.processes import FAST_LEASES, runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)


def can_restart_the_server() -> bool:
    return (connection.vendor == "mysql"
            and connection.settings_dict["HOST"] in ("", "127.0.0.1", "localhost")
            and shutil.which("mysqladmin") is not None
            and os.path.exists("/usr/sbin/mariadbd") and os.geteuid() == 0)


def test_subscribers_recover_from_a_database_restart(processes: list) -> None:
    if not can_restart_the_server():
        pytest.skip("needs a local MariaDB that this (root) user may restart")
    from bench.soak import restart_database

    sent = send_messages("accept.work", [
        OutgoingMessage({"sleep": 0.02}, partition_key=f"p{n % 4}") for n in range(200)
    ])
    settings = {**FAST_LEASES, "VISIBILITY_TIMEOUT": 5}
    for name in ("one", "two"):
        processes.append(runconsumer("--group", "workers", "--name", name, settings=settings))
    wait_for(lambda: HandlerCall.objects.filter(event="finished").count() >= 20,
             what="some messages to be handled")
    connection.close()
    restart_database()
    wait_for(lambda: set(HandlerCall.objects.filter(group="workers", event="finished")
                         .values_list("message_offset", flat=True))
             >= {s.offset for s in sent}, timeout=120, what="every message to be handled")
    assert all(process.poll() is None for process in processes)  # nobody died of it
