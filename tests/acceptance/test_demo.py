"""The README demo, run as a newcomer would: manage.py subprocesses on a fresh SQLite file."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.database_independent  # a SQLite file of its own (Makefile)


def manage(*args: str, database: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}",
           "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, text=True,
        capture_output=True, timeout=120, check=False,
    )


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "demo.sqlite3"
    migrated = manage("migrate", "-v", "0", database=path)
    assert migrated.returncode == 0, migrated.stderr
    return path


def test_demo_places_orders_and_queues_one_message_each(database: Path) -> None:
    run = manage("demo", "--orders", "3", database=database)
    assert run.returncode == 0, run.stderr
    assert "DEMO-0003" in run.stdout
    with closing(sqlite3.connect(database)) as db:
        orders = db.execute("SELECT COUNT(*) FROM shop_order").fetchone()[0]
        messages = db.execute(
            "SELECT id, partition_key FROM queue_messages WHERE topic = 'orders.created' "
            'ORDER BY "offset"'
        ).fetchall()
    assert orders == 3
    assert [m[0] for m in messages] == ["order-DEMO-0001", "order-DEMO-0002", "order-DEMO-0003"]
    # The demo's rolled-back order left neither an order nor a message.
    assert "order-DEMO-0004" not in {m[0] for m in messages}


def test_demo_runs_the_consumers_to_completion(database: Path) -> None:
    run = manage("demo", "--orders", "3", database=database)
    assert run.returncode == 0, run.stderr
    assert "billing:orders.created: 3 acked" in run.stdout
    # Orders DEMO-0001 and -0002 are over 100: the mail provider times out once for each.
    assert "emails:orders.created: 3 acked, 2 retried, 0 dead-lettered" in run.stdout
    with closing(sqlite3.connect(database)) as db:
        statuses = db.execute("SELECT reference, status FROM shop_order").fetchall()
        emails = db.execute(
            "SELECT o.reference, e.attempt FROM shop_confirmationemail e "
            "JOIN shop_order o ON o.id = e.order_id ORDER BY o.reference"
        ).fetchall()
        dead_letters = db.execute(
            "SELECT COUNT(*) FROM queue_messages WHERE topic = 'orders.created_dlq'"
        ).fetchone()[0]
    assert sorted(statuses) == [
        ("DEMO-0001", "paid"), ("DEMO-0002", "paid"), ("DEMO-0003", "paid"),
    ]
    assert emails == [("DEMO-0001", 2), ("DEMO-0002", 2), ("DEMO-0003", 1)]
    assert dead_letters == 0


def test_demo_runs_one_django_task_per_order(database: Path) -> None:
    run = manage("demo", "--orders", "2", database=database)
    assert run.returncode == 0, run.stderr
    # Two receipts and the sales report the demo's schedule published.
    assert "tasks:tasks.default: 3 acked, 0 retried, 0 dead-lettered" in run.stdout
    assert "Its receipt task (Django Tasks): no" in run.stdout  # the rolled-back order's
    assert "Receipts rendered:    2" in run.stdout
    with closing(sqlite3.connect(database)) as db:
        results = db.execute(
            "SELECT task_path, status, args, return_value FROM queue_task_results "
            "WHERE task_path LIKE '%render_receipt' ORDER BY enqueued_at"
        ).fetchall()
    assert [(path, status, args) for path, status, args, _ in results] == [
        ("example_project.shop.tasks.render_receipt", "SUCCESSFUL", '["DEMO-0001"]'),
        ("example_project.shop.tasks.render_receipt", "SUCCESSFUL", '["DEMO-0002"]'),
    ]
    assert results[1][3].startswith('"Receipt DEMO-0002: ')


def test_demo_shows_its_schedule_and_runs_one_tick(database: Path) -> None:
    run = manage("demo", "--orders", "2", database=database)
    assert run.returncode == 0, run.stderr
    assert "daily-sales-report: cron 0 7 * * * Europe/Paris; next tick " in run.stdout
    assert "Sales report (scheduled task): 2 orders, " in run.stdout
    listing = manage("queue", "schedules", database=database)
    assert listing.returncode == 0, listing.stderr
    assert "daily-sales-report: cron 0 7 * * * Europe/Paris -> task " in listing.stdout
    assert "tasks: done" in listing.stdout


def test_demo_runs_again_on_the_same_database(database: Path) -> None:
    assert manage("demo", "--orders", "2", database=database).returncode == 0
    again = manage("demo", "--orders", "2", database=database)
    assert again.returncode == 0, again.stderr
    assert "DEMO-0004" in again.stdout
    # The consumers pick up where they left off: only the two new orders.
    assert "billing:orders.created: 2 acked" in again.stdout
    assert "emails:orders.created: 2 acked" in again.stdout
    with closing(sqlite3.connect(database)) as db:
        unpaid = db.execute("SELECT COUNT(*) FROM shop_order WHERE status != 'paid'").fetchone()
        emails = db.execute("SELECT COUNT(*) FROM shop_confirmationemail").fetchone()
    assert (unpaid[0], emails[0]) == (0, 4)


def test_system_checks_pass_including_database_checks(database: Path) -> None:
    run = manage("check", "--database", "default", database=database)
    assert run.returncode == 0, run.stderr
    assert "no issues" in run.stdout
