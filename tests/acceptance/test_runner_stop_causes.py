"""Trial F16 (issue 53): a real ``runconsumer`` that stops for any reason stays listed on
the admin's Subscribers page with what stopped it and when: a signal (SIGTERM, SIGINT),
``--until-empty`` finishing, its supervisor recycling it (``--max-messages-per-child``,
``--max-memory``), or found dead (killed: its heartbeat stopped with no goodbye). An
operator's request is tests/acceptance/test_runner_control.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.consuming import supervisor
from sqlqueue.operations.runners import StoppedRunner, live_runners, stopped_runners
from tests.acceptance.processes import FAST_LEASES, ROOT, database_url, runconsumer, wait_for
from tests.acceptance.test_supervisor import wait_for_workers, workers_of

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "accept.work"


def stopped(name: str) -> StoppedRunner:
    (found,) = [r for r in stopped_runners() if r.runner == name]
    return found


def page_row(name: str) -> str:
    """The Runners table's row of ``name`` on the Subscribers page, as text."""
    client = Client()
    user = User.objects.filter(username="boss").first() or User.objects.create_superuser(
        "boss", "boss@example.com", "pw")
    client.force_login(user)
    page = client.get(reverse("admin:sqlqueue_subscriberstatus_changelist")).text
    row = page[page.index(f'data-runner="{name}"'):]
    return row[:row.index("</tr>")]


def run_until_live(name: str, *args: str) -> subprocess.Popen[str]:
    process = runconsumer("--group", "workers", "--name", name, *args, settings=FAST_LEASES)
    wait_for(lambda: name in live_runners(), what=f"{name}'s heartbeat")
    return process


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_runner_stopped_by_a_signal_is_listed_with_the_signal(
        signum: signal.Signals, processes: list) -> None:
    name = f"by-{signum.name.lower()}"
    process = run_until_live(name)
    processes.append(process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    found = stopped(name)
    assert (found.cause, found.requested_by, found.action) == ("signal", signum.name, "drain")
    assert found.obeyed_at_ms >= found.requested_at_ms > 0
    row = page_row(name)
    assert f"stopped: by the signal {signum.name} (drained) at" in row, row
    assert "exited at" in row


def test_until_empty_finishing_is_listed(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({}, partition_key="k")])
    process = runconsumer("--group", "workers", "--name", "emptier", "--until-empty",
                          settings=FAST_LEASES)
    processes.append(process)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    found = stopped("emptier")
    assert (found.cause, found.requested_by) == ("until-empty", "--until-empty")
    assert "stopped: --until-empty (nothing left to do) at" in page_row("emptier")


def test_a_killed_runner_is_found_dead(processes: list, settings: Any) -> None:
    settings.SQLQUEUE = {**getattr(settings, "SQLQUEUE", {}), **FAST_LEASES}  # as the runner's
    process = run_until_live("killed")
    processes.append(process)
    process.kill()
    process.wait(30)
    # Its heartbeat stops; once older than the lease (2 s here) it is found dead.
    wait_for(lambda: [r.cause for r in stopped_runners() if r.runner == "killed"] == ["dead"],
             what="the killed runner found dead")
    found = stopped("killed")
    assert found.obeyed_at_ms - found.requested_at_ms == FAST_LEASES["LEASE_DURATION"] * 1000
    row = page_row("killed")
    assert "found dead: its heartbeat stopped with no goodbye" in row and "last heartbeat at" in row


def test_a_runner_restarted_under_its_name_shows_how_the_last_one_stopped(
        processes: list) -> None:
    first = run_until_live("phoenix")
    processes.append(first)
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0
    second = run_until_live("phoenix")
    processes.append(second)
    assert "phoenix" not in [r.runner for r in stopped_runners()]  # live again
    row = page_row("phoenix")
    assert "running; its previous process stopped at" in row
    assert "by the signal SIGTERM (drained)" in row
    second.send_signal(signal.SIGTERM)
    assert second.wait(60) == 0


def test_a_worker_recycled_by_message_count_is_listed(processes: list) -> None:
    send_messages(TOPIC, [OutgoingMessage({}, partition_key=f"k{n % 3}") for n in range(8)])
    process = runconsumer("--group", "workers", "--processes", "1",
                          "--max-messages-per-child", "3", settings=FAST_LEASES)
    processes.append(process)
    wait_for(lambda: any(r.cause == "recycle" for r in stopped_runners()),
             what="a recycled worker listed")
    recycled = next(r for r in stopped_runners() if r.cause == "recycle")
    assert recycled.requested_by == "--max-messages 3"
    assert "recycled by its supervisor (--max-messages 3)" in page_row(recycled.runner)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0


def test_a_worker_recycled_for_its_memory_is_listed(processes: list) -> None:
    """What the supervisor does to a worker past --max-memory, step by step on a real
    worker (``--max-memory 1`` recycles each worker at its first look, 0.5 s after it
    started, mostly before it has installed its signal handlers): it writes
    ``RECYCLE_NOTE`` on the worker's lifeline, then sends SIGTERM. The worker records
    "--max-memory", not the signal."""
    read_end, write_end = os.pipe()
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                   "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1",
                   "SQLQUEUE_JSON": json.dumps(FAST_LEASES)}
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runconsumer", "--group", "workers", "--name", "big",
         "--supervisor-lifeline", str(read_end)],
        cwd=ROOT, env=environment, text=True, pass_fds=(read_end,),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(read_end)
    processes.append(process)
    try:
        wait_for(lambda: "big" in live_runners(), what="the worker's heartbeat")
        os.write(write_end, supervisor.RECYCLE_NOTE)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        os.close(write_end)
    assert process.returncode == 0, err
    found = stopped("big")
    assert (found.cause, found.requested_by) == ("recycle", "--max-memory")
    assert "recycled by its supervisor (--max-memory)" in page_row("big")


def test_the_workers_of_a_stopped_supervisor_are_listed_with_the_signal(
        processes: list) -> None:
    process = runconsumer("--group", "workers", "--processes", "2", "--name", "pool",
                          settings=FAST_LEASES)
    processes.append(process)
    wait_for_workers(process, 2)
    wait_for(lambda: {"pool-0", "pool-1"} <= set(live_runners()), what="both workers live")
    os.kill(process.pid, signal.SIGTERM)  # forwarded to each worker
    assert process.wait(60) == 0
    assert not workers_of(process.pid)
    for name in ("pool-0", "pool-1"):
        assert (stopped(name).cause, stopped(name).requested_by) == ("signal", "SIGTERM")
