"""The benchmark suite's quick mode runs and reports every scenario (correctness only: no
timing is asserted; the statement counts are deterministic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert own["statements"]["per_message"] <= 0.1
    assert own["statements"]["per_idle_poll"] == 1.0
    assert set(own["costs"]["discovery_ms"]) == {"10 partitions", "1000 partitions"}
    (split,) = own["lease_split"]
    assert (split["partitions"], split["subscribers"]) == (200, 4)
    # Reached at all (the limit is minutes): how fast is the benchmark's business.
    assert split["fair_split_s"] is not None and split["one_left_fair_again_s"] is not None
    report = (tmp_path / "results.md").read_text()
    assert "SQL statements per message" in report and "drain 3,000" in report
    assert "fair split, from start" in report
