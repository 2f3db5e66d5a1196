"""A real ``runconsumer`` on PostgreSQL, polling once an hour, is woken by a message
published from another process (this one) through NOTIFY/LISTEN."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.db import connection, transaction

from sqlqueue import send_message
from tests.acceptance.processes import runconsumer, wait_for
from tests.testapp.models import HandlerCall

pytestmark = pytest.mark.django_db(transaction=True)
#: an hour's poll, lease ticks out of the way too: the process's only reasons to poll are
#: its poll interval and a wake-up, so a message handled within the test's wait (which
#: only ends a hang) was woken for
SLOW = {"POLL_INTERVAL": 3600, "LEASE_DURATION": 3 * 3600, "LEASE_RENEW_INTERVAL": 3600,
        "VISIBILITY_TIMEOUT": 2 * 3600}


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
                       "AND application_name = 'sqlqueue wake-ups'")
        return bool(cursor.fetchone()[0])


def quiet_for(liveness: Path, seconds: float) -> bool:
    """The loop has not turned for ``seconds``: it is in its wait. Listening, it waits
    POLL_INTERVAL at once (``Pacer.polling_delay``); the listener's ring on subscribing
    was spent on a pass before."""
    return liveness.exists() and time.time() - os.stat(liveness).st_mtime >= seconds


def test_a_publish_from_another_process_wakes_a_sleeping_runconsumer(
        processes: list, tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY/LISTEN is PostgreSQL's (other databases: the Redis channel)")
    liveness = tmp_path / "alive"
    process = runconsumer("--group", "workers", "--liveness-file", str(liveness),
                          settings=SLOW)
    processes.append(process)
    wait_for(listening, what="the runner's LISTEN session")
    wait_for(lambda: quiet_for(liveness, 2), timeout=60, what="the runner to sleep")
    with transaction.atomic():
        sent = send_message("accept.work", {"n": 1}, partition_key="k")
    wait_for(lambda: HandlerCall.objects.filter(
        group="workers", event="finished", message_offset=sent.offset).exists(),
        timeout=60, what="the handler: the publish did not wake the runner from its "
        "hour-long poll", interval=0.01)
