"""``manage.py queue health`` (SPEC §9): exit codes and JSON for healthy, STOP, STALL,
unapplied migrations, an unreachable database, and the runner's liveness file."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from sqlqueue import send_message
from sqlqueue.models import PartitionLease, PartitionOffset, QueueMessage, SubscriberHeartbeat
from sqlqueue.storage.sql import store_for
from tests.acceptance.processes import ROOT
from tests.integration.consuming_helpers import register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def health(*args: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    try:
        call_command("queue", "health", "--json", *args, stdout=out)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, json.loads(out.getvalue())


def now_ms() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)


def hold(group: str, topic: str, key: str, at: int) -> None:
    SubscriberHeartbeat.objects.create(consumer_group=group, topic=topic,
                                       subscriber_name="w1", heartbeat_at=at)
    PartitionLease.objects.create(consumer_group=group, topic=topic, partition_key=key,
                                  leased_by="w1", leased_at=at, lease_renewed_at=at)


def test_healthy(register: Any) -> None:
    register("t", "g", lambda m: None)
    code, report = health("--group", "g")
    assert code == 0
    assert report["status"] == "healthy" and report["reasons"] == []
    assert [(s["group"], s["topic"], s["status"]) for s in report["subscriptions"]] == [
        ("g", "t", "OK")]
    text = io.StringIO()
    call_command("queue", "health", "--group", "g", stdout=text)
    assert text.getvalue().strip() == "healthy"


def test_stop_is_unhealthy(register: Any) -> None:
    register("t", "g", lambda m: None)
    send_message("t", 1, partition_key="k")  # pending, and nobody holds the partition
    code, report = health("--group", "g", "--topic", "t")
    assert code == 1 and report["status"] == "unhealthy"
    assert report["reasons"] == ["g on t is STOP (1 partition(s), first 'k')"]
    assert report["subscriptions"][0]["pending"] == 1


def test_stall_is_unhealthy(register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_message("t", 1, partition_key="k")
    now = now_ms()
    # Held by a live subscriber, but the watermark has not moved for 400 s while the
    # message has been due that long.
    QueueMessage.objects.filter(offset=sent.offset).update(created_at=now - 400_000)
    PartitionOffset.objects.create(consumer_group="g", topic="t", partition_key="k",
                                   offset_acked=0, updated_at=now - 400_000)
    hold("g", "t", "k", now)
    code, report = health("--group", "g")
    assert code == 1
    assert report["reasons"] == ["g on t is STALL (1 partition(s), first 'k')"]


def test_warn_is_healthy_and_unknown_filter_is_not(register: Any) -> None:
    register("t", "g", lambda m: None)
    sent = send_message("t", 1, partition_key="k")
    now = now_ms()
    QueueMessage.objects.filter(offset=sent.offset).update(created_at=now - 90_000)
    hold("g", "t", "k", now)  # held and due for 90 s: WARN (falling behind), not a restart
    code, report = health("--group", "g")
    assert (code, report["subscriptions"][0]["status"]) == (0, "WARN")
    code, report = health("--group", "nobody")
    assert code == 1 and report["reasons"] == ["no subscription matches group 'nobody'"]


def test_unapplied_migrations() -> None:
    call_command("migrate", "sqlqueue", "0005", verbosity=0)
    try:
        code, report = health()
    finally:
        call_command("migrate", "sqlqueue", verbosity=0)
    assert code == 1
    (reason,) = report["reasons"]
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    later = sorted(name for app, name in MigrationLoader(connection).disk_migrations
                   if app == "sqlqueue" and name[:4] > "0005")
    assert reason.startswith(f"{len(later)} unapplied migration(s) on 'default': "
                             f"sqlqueue.0006_created_at_default, "), reason
    assert reason.endswith("; run manage.py migrate --database default")
    assert health()[0] == 0


def manage(*args: str, url: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=timeout)


@pytest.mark.parametrize("url", ["mysql://root@127.0.0.1:1/nowhere",
                                 "postgres://postgres@127.0.0.1:1/nowhere",
                                 "sqlite:////nonexistent-dir/h/queue.sqlite3"])
def test_unreachable_database(url: str) -> None:
    done = manage("queue", "health", "--json", url=url)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "unhealthy"
    assert report["reasons"][0].startswith("database 'default' unreachable: ")


def test_liveness_file_of_a_running_consumer(tmp_path: Path) -> None:
    from tests.acceptance.processes import runconsumer, stop, wait_for

    alive = tmp_path / "alive"
    process = runconsumer("--group", "auditors", "--liveness-file", str(alive))
    try:
        wait_for(alive.exists, what="the liveness file")
        first = alive.stat().st_mtime
        wait_for(lambda: alive.stat().st_mtime > first, what="a later loop turn")
        url = "sqlite:////nonexistent-dir/h/queue.sqlite3"  # no database needed
        done = manage("queue", "health", "--liveness-file", str(alive), "--max-age", "30",
                      "--json", url=url)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["status"] == "healthy"
    finally:
        stop(process)
    # The process is gone: its last turn ages past --max-age.
    done = manage("queue", "health", "--liveness-file", str(alive), "--max-age", "0",
                  url="sqlite:////nonexistent-dir/h/queue.sqlite3")
    assert done.returncode == 1 and "last turned" in done.stdout
    done = manage("queue", "health", "--liveness-file", str(tmp_path / "missing"),
                  url="sqlite:////nonexistent-dir/h/queue.sqlite3")
    assert done.returncode == 1 and "unreadable" in done.stdout


def test_a_liveness_file_passes_on_what_the_runner_warns_about(tmp_path: Path) -> None:
    """Issue 51: a deaf wake-up listener (``Wakeups.deaf``) is written into the liveness
    file by the runner's loop, and ``queue health --liveness-file`` shows it as a
    warning (still healthy: polls cover the gap); gone once it hears again."""
    from sqlqueue.consuming.liveness import touch

    alive = tmp_path / "alive"
    alive.write_text("left over from an earlier run\n")
    touch(str(alive), ["The PostgreSQL LISTEN channel heard nothing for 10s"])
    done = manage("queue", "health", "--liveness-file", str(alive), "--max-age", "30",
                  url="sqlite:////nonexistent-dir/h/queue.sqlite3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "healthy", "  warning: The PostgreSQL LISTEN channel heard nothing for 10s"]
    touch(str(alive))
    done = manage("queue", "health", "--liveness-file", str(alive), "--max-age", "30",
                  url="sqlite:////nonexistent-dir/h/queue.sqlite3")
    assert done.stdout.splitlines() == ["healthy"]
