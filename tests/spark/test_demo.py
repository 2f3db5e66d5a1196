"""``make spark-demo``: the shop's traffic, then the analytics job through spark-submit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, database: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}",
           "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def test_the_spark_demo_prints_where_its_report_is(tmp_path: Path) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the demo runs on its own SQLite file: once per CI run is enough")
    database, out = tmp_path / "demo.sqlite3", tmp_path / "report"
    migrated = manage("migrate", "-v", "0", database=database)
    assert migrated.returncode == 0, migrated.stderr
    run = manage("spark_demo", "--orders", "8", "--seconds", "2", "--out", str(out),
                 database=database)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"The report is at {out / 'report.html'}" in run.stdout
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 5
    latency = pd.read_csv(out / "aggregates" / "latency.csv")
    assert set(latency["consumer_group"]) == {"billing", "emails", "tasks"}
    assert set(latency["acked"]) == {8}
    dead = pd.read_csv(out / "aggregates" / "dead_letters.csv")
    assert sorted(dead["consumer_group"]) == ["billing", "emails"]  # the missing order
    per_second = pd.read_csv(out / "aggregates" / "messages_per_second.csv")
    assert per_second["messages"].sum() == 8 + 1 + 8  # orders, the missing one, receipts
