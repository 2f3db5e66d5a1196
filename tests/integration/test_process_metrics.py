"""A runner's own metrics (``runconsumer --metrics-port``): in process, and from two real
``runconsumer`` processes on one host, each serving its own port."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sqlqueue
from sqlqueue import OutgoingMessage, send_messages
from sqlqueue.metrics import ProcessMetrics
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_runner_records_outcomes_durations_polls_and_leases(register: Any) -> None:
    def handler(message: sqlqueue.Message) -> None:
        if message.payload == "reject":
            raise sqlqueue.Reject("no")
        if message.payload == "retry" and message.attempt == 1:
            raise sqlqueue.Retry(delay=0, reason="again")

    register("t", "g", handler)
    send_messages("t", [OutgoingMessage(p, partition_key="k")
                        for p in ("ok", "ok", "reject", "retry")])
    metrics = ProcessMetrics()
    drain(["g"], instruments=metrics)
    from prometheus_client import generate_latest

    s = samples(generate_latest(metrics.registry).decode())
    labels = (("group", "g"), ("topic", "t"))

    def handled(outcome: str) -> float:
        return s.get(("sqlqueue_handled_total",
                       tuple(sorted((*labels, ("outcome", outcome))))), 0)

    assert (handled("ack"), handled("reject"), handled("retry")) == (3, 1, 1)
    assert s[("sqlqueue_handler_duration_seconds_count", labels)] == 5
    assert s[("sqlqueue_start_latency_seconds_count", labels)] == 5
    assert s[("sqlqueue_polls_total", labels)] >= 2  # the retry is a later pass
    assert s[("sqlqueue_delivered_total", labels)] == 5
    assert s[("sqlqueue_lease_changes_total", (("change", "gained"), *labels))] == 1
    assert s[("sqlqueue_statements_total", ())] > 5
    assert s[("sqlqueue_reconnects_total", ())] == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_processes_each_serve_their_own_counters() -> None:
    from tests.acceptance.processes import runconsumer, stop, wait_for

    sent = send_messages("accept.work", [OutgoingMessage({"n": n}, partition_key=f"k{n % 4}")
                                         for n in range(40)])
    ports = [free_port(), free_port()]
    processes = [runconsumer("--group", "auditors", "--metrics-port", str(port),
                             "--metrics-address", "127.0.0.1", settings={"POLL_INTERVAL": 0.05})
                 for port in ports]

    def handled() -> list[float]:
        totals = []
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return []
            totals.append(sum(v for (name, _), v in samples(text).items()
                              if name == "sqlqueue_handled_total"))
        return totals

    try:
        wait_for(lambda: sum(handled()) == len(sent), timeout=60,
                 what="both processes' counters to add up to the messages sent")
        assert len(handled()) == 2
    finally:
        for process in processes:
            stop(process)


@pytest.mark.parametrize(("arguments", "address"), [
    ([], "127.0.0.1"),  # N8: this host only unless told otherwise
    (["--metrics-host", "0.0.0.0"], "0.0.0.0"),
    (["--metrics-address", "10.0.0.5"], "10.0.0.5"),  # the older spelling
])
def test_metrics_listen_on_this_host_only_by_default(
        arguments: list[str], address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlqueue.metrics
    from sqlqueue.management.commands.runconsumer import Command

    served: list[tuple[int, str]] = []
    monkeypatch.setattr(sqlqueue.metrics, "start_http_server",
                        lambda port, addr, registry: served.append((port, addr)))
    command = Command()
    options = vars(command.create_parser("manage.py", "runconsumer").parse_args(
        ["--metrics-port", "9101", *arguments]))
    assert command._instruments(options) is not None
    assert served == [(9101, address)]


def test_a_supervisor_passes_the_metrics_host_to_its_workers() -> None:
    from sqlqueue.management.commands.runconsumer import Command

    command = Command()
    parser = command.create_parser("manage.py", "runconsumer")
    options = vars(parser.parse_args(["--processes", "2", "--metrics-port", "9101"]))
    worker = command._worker_command(options, slot=1, lifeline=3)
    at = worker.index("runconsumer") + 1
    parsed = vars(parser.parse_args(worker[at:]))
    assert (parsed["metrics_port"], parsed["metrics_address"]) == (9102, "127.0.0.1")
