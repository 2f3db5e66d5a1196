"""Spark on a real cluster (issue 15): a standalone master and two workers of the test's
own, on free localhost ports; the data source read, written and streamed by a job that
``spark-submit`` sends there, and the analytics job submitted the same way. Executors are
separate JVMs with Python workers of their own: what they need installed is what a YARN
or Kubernetes executor needs (docs/guides/spark.md, "On a cluster")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from sqlqueue import send_messages
from sqlqueue.models import QueueMessage
from sqlqueue.storage.sql import store_for
from tests.spark.conftest import wait_until

HERE = Path(__file__).resolve().parent


def spark_bin(name: str) -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / name)


def spark_env() -> dict[str, str]:
    from sqlqueue.integrations.spark.session import prepare_environment

    prepare_environment()  # JAVA_HOME, and the virtualenv's Python for the workers
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC"}


def master_url(log: Path) -> str | None:
    """The ``spark://`` URL the master logs once it has bound its port."""
    found = re.search(r"Starting Spark master at (spark://\S+)", log.read_text(errors="replace"))
    return found.group(1) if found else None


def registered_workers(logs: Path) -> int:
    """Workers that say they registered with the master. Their own logs, not the master's
    web UI: a UI port picked in advance can be taken by the time the master binds it, and
    then whatever answers there is not the master."""
    return sum("Successfully registered with master" in log.read_text(errors="replace")
               for log in logs.glob("worker*.log"))


def daemon(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen([spark_bin("spark-class"), *args], env=env, stdout=output,
                                stderr=subprocess.STDOUT)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """``spark://`` URL of a master with two one-core workers, stopped after the test."""
    if connection.vendor != "mysql":
        # Checked before the cluster starts: starting it costs a minute.
        pytest.skip("a cluster smoke test: once is enough, on MySQL (make topologies)")
    env, logs = spark_env(), tmp_path / "logs"
    logs.mkdir()
    # Port 0 everywhere: the master says which port it bound, nothing is picked in advance.
    started = [daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                       "--port", "0", "--webui-port", "0"], env, logs / "master.log")]
    try:
        deadline = time.monotonic() + 120
        while not (master := master_url(logs / "master.log")):
            assert time.monotonic() < deadline, (logs / "master.log").read_text()[-3000:]
            assert started[0].poll() is None, "the Spark master exited"
            time.sleep(0.5)
        for n in range(2):
            started.append(daemon(
                ["org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", "0",
                 "--work-dir", str(tmp_path / f"work{n}")], env, logs / f"worker{n}.log"))
        while registered_workers(logs) < 2:
            assert time.monotonic() < deadline, (logs / "master.log").read_text()[-3000:]
            assert all(p.poll() is None for p in started), "a Spark daemon exited"
            time.sleep(0.5)
        yield master
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def submit(master: str, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [spark_bin("spark-submit"), "--master", master, "--conf", "spark.ui.enabled=false",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.sql.session.timeZone=UTC",
         *args], env={**spark_env(), **(env or {})}, text=True, capture_output=True,
        timeout=600, check=False)


@pytest.mark.topology  # two minutes of a cluster's own: make topologies, not make test
def test_the_source_and_the_report_on_a_standalone_cluster(
        standalone: str, db_url: str, tmp_path: Path) -> None:
    sent = send_messages("cluster.in", [{"n": n} for n in range(30)])
    newest = max(QueueMessage.objects.filter(topic="cluster.in")
                 .values_list("created_at", flat=True))
    # The stream reads what has settled: wait out the job's maxTransactionAge (1 s).
    wait_until(lambda: database_now() > newest + 1500, "the rows to settle")
    job = submit(standalone, str(HERE / "cluster_job.py"), db_url)
    assert job.returncode == 0, job.stderr[-4000:]
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["master"] == standalone
    assert result["executors"] == 2
    assert result["read"] == sorted(s.id for s in sent)
    assert result["streamed"] == sorted(s.id for s in sent)
    stored = set(QueueMessage.objects.filter(topic="cluster.out").values_list("id", flat=True))
    assert stored == {f"out-{n}" for n in range(60)}

    import sqlqueue.spark.analytics as analytics

    out = tmp_path / "report"
    report = submit(standalone, analytics.__file__, "--out", str(out), "--bucket", "second",
                    env={"DATABASE_URL": db_url})
    assert report.returncode == 0, report.stderr[-4000:]
    assert (out / "report.html").exists()


def database_now() -> int:
    with connection.cursor() as cursor:
        return store_for(connection).database_now_ms(cursor)
