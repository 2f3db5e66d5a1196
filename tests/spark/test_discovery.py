"""``spark.read.format("sqlqueue")`` on a plain SparkSession, with no registration: PySpark
4 discovers the top-level ``pyspark_sqlqueue.DefaultSource`` (issue 13, SPEC §9). A
session of its own, in a subprocess: the shared test session was registered explicitly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from sqlqueue import send_messages

PLAIN_SESSION = textwrap.dedent("""
    import json, sys
    from sqlqueue.integrations.spark.session import prepare_environment
    prepare_environment()  # Java and the workers' Python only; nothing is registered
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    frame = (spark.read.format("sqlqueue").option("url", sys.argv[1])
             .option("topic", "discovered").load())
    print(json.dumps(sorted(row["offset"] for row in frame.collect())))
    spark.stop()
""")


def test_a_plain_session_finds_the_source_by_name(db_url: str) -> None:
    sent = send_messages("discovered", [{"n": n} for n in range(3)])
    result = subprocess.run([sys.executable, "-c", PLAIN_SESSION, db_url], text=True,
                            capture_output=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [s.offset for s in sent]
