"""The live overview's numbers from a real ``runconsumer`` (issue 42): its per-minute
rollup reaches the database while it runs, agrees with its own ``/metrics``, and its
last seconds are written when it stops (SIGTERM)."""

from __future__ import annotations

import signal
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.operations.overview import SubscriptionActivity, activity
from tests.acceptance.processes import runconsumer, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"POLL_INTERVAL": 0.05, "MAX_ATTEMPTS": 2, "MIN_BACKOFF": 0.05,
            "MAX_BACKOFF": 0.1}
#: payloads of tests.testapp.consumers.obey: 8 acked, one failed once then acked, one
#: rejected, one failing twice (dead-lettered at MAX_ATTEMPTS=2)
PAYLOADS = ([{"n": n} for n in range(7)] + [{"sleep": 0.06}, {"fail_times": 1},
                                            {"reject": True}, {"unknown_sku": "x"}])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def workers() -> SubscriptionActivity | None:
    return next((s for s in activity() if s.group == "workers"), None)


def handled_by_outcome(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "sqlqueue_handled_total"
            and s.labels.get("group") == "workers"}


def test_a_running_consumer_fills_the_overview_as_its_metrics_count() -> None:
    send_messages("accept.work", [OutgoingMessage(p, partition_key=f"k{i % 3}")
                                  for i, p in enumerate(PAYLOADS)])
    port = free_port()
    process = runconsumer("--group", "workers", "--metrics-port", str(port),
                          settings=SETTINGS)
    try:
        # While it runs: within one flush interval (10 s) of the last handler run.
        wait_for(lambda: (w := workers()) is not None
                 and w.total.acked + w.total.dead_lettered == 11,
                 timeout=60, what="the rollup's rows")
        total = workers().total  # type: ignore[union-attr]
        assert (total.published, total.acked, total.retried, total.dead_lettered) == (
            11, 9, 2, 2)
        assert {k: v for k, v in handled_by_outcome(port).items() if v} == {
            k: float(v) for k, v in total.handled.items() if v}
        assert total.p95 is not None and total.p95 > 0.05  # the slow one
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
    finally:
        stop(process)
    after = workers().total  # type: ignore[union-attr]
    assert after.handled == total.handled  # nothing counted twice at exit


def test_an_until_empty_run_writes_its_last_seconds_before_it_exits() -> None:
    send_messages("accept.work", [OutgoingMessage({"n": n}) for n in range(5)])
    process = runconsumer("--group", "workers", "--until-empty", settings=SETTINGS)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    total = workers().total  # type: ignore[union-attr]
    assert (total.published, total.acked) == (5, 5)
