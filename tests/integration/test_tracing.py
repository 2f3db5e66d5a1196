"""OpenTelemetry propagation: a trace id survives publish -> handler (opentelemetry-sdk
records the spans in memory)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
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


class JaegerLikeBaggage(TextMapPropagator):
    """Baggage as other propagators carry it, under keys of their own: Jaeger's
    ``uberctx-<key>`` (OpenTracing's ``ot-baggage-<key>`` alike). A stand-in for
    opentelemetry-propagator-jaeger, which extracts exactly so."""

    PREFIX = "uberctx-"

    def extract(self, carrier: Any, context: Context | None = None,
                getter: Getter[Any] = default_getter) -> Context:
        from opentelemetry import baggage

        context = context if context is not None else Context()
        for key in getter.keys(carrier):
            if key.startswith(self.PREFIX):
                value = (getter.get(carrier, key) or [""])[0]
                context = baggage.set_baggage(key[len(self.PREFIX):], value, context)
        return context

    def inject(self, carrier: Any, context: Context | None = None,
               setter: Setter[Any] = default_setter) -> None:
        pass

    @property
    def fields(self) -> set[str]:
        return set()


class ParentBaggage(SpanProcessor):
    """What a span processor is told of the consumer span's parent context: processors
    such as opentelemetry-processor-baggage's copy its baggage into the span's
    attributes."""

    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        from opentelemetry import baggage

        if span.name == "process t":
            self.seen.append(dict(baggage.get_all(parent_context)))


def test_no_propagators_baggage_is_taken_into_the_handler(register: Any) -> None:
    """Audit W9: dropping the ``baggage`` key stopped W3C baggage only; a Jaeger or
    OpenTracing propagator, if configured, still brought the publisher's baggage into the
    consumer span's parent context (which span processors read). Now no propagator's
    baggage is, neither there nor in the handler (the trace ids still correlate)."""
    from opentelemetry import baggage, propagate
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    seen: list[tuple[int, dict[str, object]]] = []

    def handler(message: sqlqueue.Message) -> None:
        seen.append((trace.get_current_span().get_span_context().trace_id,
                     dict(baggage.get_all())))

    register("t", "g", handler)
    processor = ParentBaggage()
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(processor)
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator(
        [TraceContextTextMapPropagator(), W3CBaggagePropagator(), JaegerLikeBaggage()]))
    try:
        send_message("t", 1, metadata={"traceparent": given, "uberctx-role": "admin",
                                       "Baggage": "tenant=other"})
        drain(["g"])
        # The stand-in does bring the baggage, outside sqlqueue:
        assert baggage.get_all(propagate.extract({"uberctx-role": "admin"})) == {
            "role": "admin"}
    finally:
        propagate.set_global_textmap(previous)
    assert seen == [(0x0AF7651916CD43DD8448EB211C80319C, {})]
    assert processor.seen == [{}]


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
