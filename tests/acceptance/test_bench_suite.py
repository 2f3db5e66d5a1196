"""The benchmark suite's quick mode runs and reports every scenario (correctness only: no
timing is asserted; the statement counts are deterministic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.processes import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def test_quick_suite_reports_every_scenario(mysql_only: None, tmp_path: Path) -> None:
    # Its own database (sqlqueue_bench), as a user would run it.
    run = subprocess.run([sys.executable, "-m", "bench.suite", "--quick", "--no-peers",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    own = results["sqlqueue"]
    assert own["publish"]["single_count"] == 300 and own["publish"]["bulk_count"] == 5000
    assert own["publish"]["bulk_parallel_processes"] == 2
    assert own["publish"]["bulk_parallel_per_s"] > 0
    assert [d["processes"] for d in own["drain"]] == [1, 2, 1]
    # The 0.1 target is the benchmark's (docs/benchmarks.md); on a loaded machine the drain
    # polls a few extra times while handlers finish. What a test can hold under any load:
    # batching works, well under one statement per message.
    assert 0 < own["statements"]["per_message"] < 0.5
    assert own["statements"]["per_idle_poll"] == 1.0
    assert set(own["costs"]["discovery_ms"]) == {"10 partitions", "1000 partitions"}
    (split,) = own["lease_split"]
    assert (split["partitions"], split["subscribers"]) == (200, 4)
    # Reached at all (the limit is minutes): how fast is the benchmark's business.
    assert split["fair_split_s"] is not None and split["one_left_fair_again_s"] is not None
    report = (tmp_path / "results.md").read_text()
    assert "SQL statements per message" in report and "drain 3,000" in report
    assert "fair split, from start" in report
    # The PostgreSQL section: publishing there (the peers need their own virtualenv).
    postgresql = results["postgresql"]
    assert "## PostgreSQL" in report
    if not postgresql.get("skipped"):  # no server: said so in the report
        assert postgresql["machine"]["database"] == "postgresql"
        assert postgresql["publish"]["database"] == "postgresql"
        assert postgresql["publish"]["bulk_count"] == 5000
        assert postgresql["publish"]["bulk_per_s"] > 0


def test_postgresql_targets_are_judged_from_the_peer_figures() -> None:
    from bench.suite import postgresql_markdown, postgresql_targets

    def peer(single: float, drain: float, p99: float) -> dict[str, Any]:
        return {"enqueue_single": {"msgs_per_s": single}, "enqueue_bulk": {"na": True},
                "drain_1": {"jobs_per_s": drain / 2}, "drain_2": {"jobs_per_s": drain},
                "latency": {"lat_ms_p50": p99 / 2, "lat_ms_p95": p99, "lat_ms_p99": p99}}

    section = {
        "machine": {"database": "postgresql", "database_settings": {}},
        "publish": {"single_per_s": 900, "bulk_per_s": 30_000, "bulk_parallel_per_s": 40_000,
                    "bulk_parallel_processes": 2},
        "peers": {"tasks_db": peer(500, 50, 900), "procrastinate": peer(400, 200, 300),
                  "sqlqueue": peer(900, 2000, 30)},
    }
    assert [(name, ok) for name, _, _, ok in postgresql_targets(section)] == [
        ("one-message publish vs django-tasks-db", True),  # 1.8x
        ("drain, 2 processes, vs Procrastinate", True),  # 10x
        ("publish-to-start latency p99 at 100 msg/s, default settings", False),  # 30 ms
    ]
    report = "\n".join(postgresql_markdown(section, rounds=3))
    assert "| procrastinate | 400 | n/a | 100 | 200 | 150 / 300 / 300 |" in report
    assert "| publish-to-start latency p99 at 100 msg/s, default settings | <= 25 ms | 30 ms" \
        in report
    # Without the peers (--no-peers) nothing can be judged but nothing breaks either.
    assert postgresql_targets({**section, "peers": {}}) == []


def test_the_reference_insert_bounds_the_publish_ratio_in_the_report() -> None:
    from bench.suite import REFERENCE, peer_table

    peers = {"tasks_db": {"enqueue_single": {"msgs_per_s": 800}},
             "sqlqueue": {"enqueue_single": {"msgs_per_s": 1200}},
             REFERENCE: {"enqueue_single": {"msgs_per_s": 1600}}}
    report = "\n".join(peer_table(peers, rounds=3))
    assert f"| {REFERENCE} | 1,600 |" in report
    assert "share of its 1,600 msg/s: tasks_db 50%, sqlqueue 75%." in report
    assert "as fast as it would be 2.00x django-tasks-db." in report
    # A run without it (--peers chosen without the reference) adds nothing.
    del peers[REFERENCE]
    assert "no queue" not in "\n".join(peer_table(peers, rounds=3))
