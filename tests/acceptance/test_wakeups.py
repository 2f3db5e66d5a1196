"""A real ``runconsumer`` on PostgreSQL, polling every 30 s, is woken by a message
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
#: lease ticks out of the way too: the process's only reasons to poll are its poll
#: interval and a wake-up
SLOW = {"POLL_INTERVAL": 30, "LEASE_DURATION": 180, "LEASE_RENEW_INTERVAL": 60}


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
                       "AND application_name = 'sqlqueue wake-ups'")
        return bool(cursor.fetchone()[0])


def quiet_for(liveness: Path, seconds: float) -> bool:
    """The loop has not turned for ``seconds``: its adaptive wait has grown past that
    (a wait doubles from 2 ms), so its next poll is at least as far away."""
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
    # Quiet for 4.5 s: the current wait is at least 8.2 s long (2 ms doubling), so the
    # next poll is at least 3.7 s away.
    wait_for(lambda: quiet_for(liveness, 4.5), timeout=60, what="the runner to sleep")
    with transaction.atomic():
        sent = send_message("accept.work", {"n": 1}, partition_key="k")
    took = wait_for(lambda: HandlerCall.objects.filter(
        group="workers", event="finished", message_offset=sent.offset).exists(),
        timeout=30, what="the handler", interval=0.01)
    assert took < 2.0
