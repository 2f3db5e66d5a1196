"""OpenTelemetry propagation, when ``opentelemetry-api`` is installed (``django-sqlqueue[otel]``).

``send_message`` writes the current trace context (W3C ``traceparent``, or whatever
propagator the application configured) into the message's metadata; the handler then
runs in a CONSUMER span that is a child of that context and linked to it, so a trace id
survives publish -> handler. Without the package, or outside any span, nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import baggage, propagate, trace
except ImportError:  # pragma: no cover - the extra is missing
    baggage = propagate = trace = None  # type: ignore[assignment]

TRACER = "sqlqueue"


#: ``inject``'s default: read the current trace context
CURRENT: Any = object()


def current_context() -> dict[str, str] | None:
    """The current trace context as propagation headers (W3C ``traceparent``, or what
    the application's propagator writes); None outside a valid span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def inject(metadata: Mapping[str, str] | None,
           context: Mapping[str, str] | None = CURRENT) -> Mapping[str, str] | None:
    """``metadata`` plus the trace ``context`` (by default the current one; a batch reads
    ``current_context()`` once for all its messages); unchanged without one, or when the
    caller set a ``traceparent`` of its own."""
    if context is CURRENT:
        context = current_context()
    if not context:
        return metadata
    if metadata is not None and (not isinstance(metadata, Mapping)
                                 or "traceparent" in metadata):
        return metadata  # a bad value is reported by the metadata's validation
    return {**(metadata or {}), **context}


def consumer_span(topic: str, group: str, partition: str, offset: int, message_id: str,
                  attempt: int, metadata: Mapping[str, str]) -> AbstractContextManager[Any]:
    """The span a handler runs in (a no-op without opentelemetry-api, or while no tracer
    provider is configured: then it costs nothing per message)."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext()
    return _span(topic, group, partition, offset, message_id, attempt, metadata)


@contextmanager
def _span(topic: str, group: str, partition: str, offset: int, message_id: str,
          attempt: int, metadata: Mapping[str, str]) -> Iterator[Any]:
    # Metadata is whatever the publisher wrote: its trace context is taken for
    # correlation (parent and link), never its baggage, whichever propagator carries it
    # (W3C's ``baggage``, Jaeger's ``uberctx-*``, OpenTracing's ``ot-baggage-*``): span
    # processors read the parent context's (some copy it into the span's attributes), and
    # it would otherwise ride along as if this process had set it.
    parent = baggage.clear(propagate.extract(dict(metadata)))
    sent = trace.get_current_span(parent).get_span_context()
    links = [trace.Link(sent)] if sent.is_valid else []
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(
        f"process {topic}", context=parent if sent.is_valid else None,
        kind=trace.SpanKind.CONSUMER, links=links,
        attributes={"messaging.system": "sqlqueue", "messaging.operation.type": "process",
                    "messaging.destination.name": topic,
                    "messaging.consumer.group.name": group,
                    "messaging.destination.partition.id": partition,
                    "messaging.message.id": message_id, "sqlqueue.offset": offset,
                    "sqlqueue.attempt": attempt},
    ) as span:
        yield span
