"""OpenTelemetry spans for send, store and deliver, when the application configured OpenTelemetry.

Only ``opentelemetry-api`` is used (the ``trace`` extra); the application brings the SDK and sets
its tracer provider. Until it does, the API's provider is a proxy and no span is made. Spans are
made by the recorder's writer thread from the queued events, with the times the events happened,
so a send never waits for a span processor. Each span is parented on the message's incoming
``trace_context`` (the RocketMQ 5 protocol's W3C traceparent, kept as the ``TRACE_CONTEXT``
property); a message without one starts a trace of its own.
"""

from __future__ import annotations

from typing import Any

from plugmq.core.trace import TraceKind
from plugmq.plugins.trace.recorder import PendingEvent

__all__ = ["SpanMaker", "span_maker"]

_MS = 1_000_000  # nanoseconds


class SpanMaker:
    """Turns queued events into spans on the configured tracer provider."""

    def __init__(self, trace_api: Any, propagator: Any) -> None:
        self._api = trace_api
        self._propagator = propagator

    def configured(self) -> bool:
        """Whether an application set a tracer provider (the API's default is a do-nothing proxy)."""
        return not isinstance(self._api.get_tracer_provider(), self._api.ProxyTracerProvider)

    def __call__(self, events: list[PendingEvent]) -> None:
        if not self.configured():
            return
        tracer = self._api.get_tracer("plugmq.trace")
        kind = self._api.SpanKind
        for (_seq, at_ms, event, unique_id, _msg_id, topic, queue_id, _offset, group, client, attempt, _detail,
             trace_context, born_ms, store_ms) in events:
            parent = self._propagator.extract({"traceparent": trace_context}) if trace_context else None
            attributes = {"messaging.system": "rocketmq", "messaging.destination.name": topic,
                          "messaging.message.id": unique_id, "messaging.destination.partition.id": str(queue_id)}
            if event is TraceKind.STORED:
                send = tracer.start_span(f"send {topic}", context=parent, kind=kind.SERVER,
                                         start_time=born_ms * _MS, attributes={**attributes,
                                                                               "messaging.operation.name": "send"})
                store = tracer.start_span(f"store {topic}", context=self._api.set_span_in_context(send),
                                          kind=kind.INTERNAL, start_time=store_ms * _MS, attributes=attributes)
                store.end(end_time=max(at_ms, store_ms) * _MS)
                send.end(end_time=max(at_ms, born_ms) * _MS)
            elif event is TraceKind.DELIVERED:
                span = tracer.start_span(f"deliver {topic}", context=parent, kind=kind.SERVER,
                                         start_time=at_ms * _MS,
                                         attributes={**attributes, "messaging.operation.name": "deliver",
                                                     "messaging.consumer.group.name": group,
                                                     "messaging.client.id": client,
                                                     "messaging.rocketmq.message.delivery_attempt": attempt})
                span.end(end_time=at_ms * _MS)


def span_maker() -> SpanMaker | None:
    """A SpanMaker when ``opentelemetry-api`` is installed, else None (the trace topic still records)."""
    try:
        from opentelemetry import trace as trace_api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return SpanMaker(trace_api, TraceContextTextMapPropagator())
