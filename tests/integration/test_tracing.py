"""OpenTelemetry propagation: a trace id survives publish -> handler (opentelemetry-sdk
records the spans in memory)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sqlqueue
from sqlqueue import send_message
from tests.integration.consuming_helpers import drain, register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    # The global provider can be set once per process: the first test module wins.
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    current.add_span_processor(SimpleSpanProcessor(EXPORTER))


def test_trace_id_survives_publish_to_handler(register: Any) -> None:
    seen: list[tuple[int, dict[str, str]]] = []

    def handler(message: sqlqueue.Message) -> None:
        seen.append((trace.get_current_span().get_span_context().trace_id,
                     dict(message.metadata)))

    register("t", "g", handler)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        send_message("t", {"n": 1}, partition_key="k", metadata={"who": "me"})
        sent = request.get_span_context()
    send_message("t", {"n": 2}, partition_key="k")  # outside any span: no traceparent
    drain(["g"])

    (traced_id, traced_meta), (plain_id, plain_meta) = seen
    assert traced_id == sent.trace_id
    assert traced_meta["who"] == "me"
    assert traced_meta["traceparent"].split("-")[1] == f"{sent.trace_id:032x}"
    assert "traceparent" not in plain_meta and plain_id != sent.trace_id

    spans = [s for s in EXPORTER.get_finished_spans() if s.name == "process t"]
    consumer = next(s for s in spans if s.context.trace_id == sent.trace_id)
    assert consumer.kind == trace.SpanKind.CONSUMER
    assert consumer.parent is not None and consumer.parent.span_id == sent.span_id
    assert [link.context.span_id for link in consumer.links] == [sent.span_id]
    assert consumer.attributes["messaging.consumer.group.name"] == "g"
    assert consumer.attributes["messaging.destination.partition.id"] == "k"


def test_a_callers_traceparent_is_kept(register: Any) -> None:
    seen: list[dict[str, str]] = []
    register("t", "g", lambda m: seen.append(dict(m.metadata)))
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("test").start_as_current_span("request"):
        send_message("t", 1, partition_key="k", metadata={"traceparent": given})
    drain(["g"])
    assert seen == [{"traceparent": given}]


def test_a_publishers_baggage_is_not_taken_into_the_handler(register: Any) -> None:
    """N10: trace context in metadata is publisher-controlled; its trace ids correlate,
    its baggage is dropped (it would ride along on the handler's outgoing calls)."""
    from opentelemetry import baggage, propagate
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    seen: list[tuple[int, dict[str, object]]] = []

    def handler(message: sqlqueue.Message) -> None:
        seen.append((trace.get_current_span().get_span_context().trace_id,
                     dict(baggage.get_all())))

    register("t", "g", handler)
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator(
        [TraceContextTextMapPropagator(), W3CBaggagePropagator()]))
    try:
        send_message("t", 1, metadata={"traceparent": given, "baggage": "role=admin"})
        drain(["g"])
    finally:
        propagate.set_global_textmap(previous)
    assert seen == [(0x0AF7651916CD43DD8448EB211C80319C, {})]


def test_every_message_of_a_batch_carries_the_trace(register: Any) -> None:
    """send_messages reads the trace context once for the batch: every message gets it,
    and one that brings its own traceparent keeps it."""
    seen: list[dict[str, str]] = []
    register("t", "g", lambda m: seen.append(dict(m.metadata)))
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("test").start_as_current_span("batch") as batch:
        sqlqueue.send_messages("t", [
            sqlqueue.OutgoingMessage(1, partition_key="k"),
            sqlqueue.OutgoingMessage(2, partition_key="k", metadata={"who": "me"}),
            sqlqueue.OutgoingMessage(3, partition_key="k", metadata={"traceparent": given}),
        ])
        trace_id = f"{batch.get_span_context().trace_id:032x}"
    sqlqueue.send_messages("t", [sqlqueue.OutgoingMessage(4, partition_key="k")])
    drain(["g"])
    assert [m.get("traceparent", "").split("-")[1:2] for m in seen[:2]] == [[trace_id]] * 2
    assert seen[1]["who"] == "me"
    assert seen[2] == {"traceparent": given}
    assert "traceparent" not in seen[3]
