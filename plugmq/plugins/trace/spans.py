"""OpenTelemetry spans for send, store and deliver, when the application configured OpenTelemetry.

Only ``opentelemetry-api`` is used (the ``trace`` extra); the application brings the SDK and sets
its tracer provider. Until it does, the API's provider is a proxy and no span is made. Spans are
made by the recorder's writer thread from the queued events, with the times the steps happened,
so neither a send nor a receive waits for a span processor. Each span is parented on the message's
incoming ``trace_context`` (the RocketMQ 5 protocol's W3C traceparent, kept as the ``TRACE_CONTEXT``
property); a message without one starts a trace of its own.

The plugin does no work on the send path, so the *send* span (born time to store time) and its
*store* child are made when the message is first delivered, from the times the message carries;
a message no consumer ever received has no broker spans (its producer's own span stays).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from plugmq.core.trace import TraceKind
from plugmq.plugins.trace.recorder import PendingEvent

__all__ = ["SpanMaker", "span_maker"]

_MS = 1_000_000  # nanoseconds
_REMEMBERED = 100_000  # unique ids whose send span was made (a redelivery makes none again)


class SpanMaker:
    """Turns queued events into spans on the configured tracer provider."""

    def __init__(self, trace_api: Any, propagator: Any) -> None:
        self._api = trace_api
        self._propagator = propagator
        self._sent: OrderedDict[str, None] = OrderedDict()  # messages whose send span exists

    def configured(self) -> bool:
        """Whether an application set a tracer provider (the API's default is a do-nothing proxy)."""
        return not isinstance(self._api.get_tracer_provider(), self._api.ProxyTracerProvider)

    def __call__(self, events: list[PendingEvent]) -> None:
        if not self.configured():
            return
        tracer = self._api.get_tracer("plugmq.trace")
        for (_seq, at_ms, event, unique_id, _where, topic, queue_id, _offset, group, client, attempt, _detail,
             trace_context, born_ms, store_ms) in events:
            if event is not TraceKind.DELIVERED:
                continue
            parent = self._propagator.extract({"traceparent": trace_context}) if trace_context else None
            attributes = {"messaging.system": "rocketmq", "messaging.destination.name": topic,
                          "messaging.message.id": unique_id, "messaging.destination.partition.id": str(queue_id)}
            if unique_id not in self._sent:
                self._sent[unique_id] = None
                if len(self._sent) > _REMEMBERED:
                    self._sent.popitem(last=False)
                self._send_spans(tracer, parent, topic, attributes, born_ms, store_ms)
            span = tracer.start_span(f"deliver {topic}", context=parent, kind=self._api.SpanKind.SERVER,
                                     start_time=at_ms * _MS,
                                     attributes={**attributes, "messaging.operation.name": "deliver",
                                                 "messaging.consumer.group.name": group, "messaging.client.id": client,
                                                 "messaging.rocketmq.message.delivery_attempt": attempt})
            span.end(end_time=at_ms * _MS)

    def _send_spans(self, tracer: Any, parent: Any, topic: str, attributes: dict[str, Any], born_ms: int,
                    store_ms: int) -> None:
        kind = self._api.SpanKind
        send = tracer.start_span(f"send {topic}", context=parent, kind=kind.SERVER, start_time=born_ms * _MS,
                                 attributes={**attributes, "messaging.operation.name": "send"})
        store = tracer.start_span(f"store {topic}", context=self._api.set_span_in_context(send), kind=kind.INTERNAL,
                                  start_time=store_ms * _MS, attributes=attributes)
        store.end(end_time=store_ms * _MS)
        send.end(end_time=max(born_ms, store_ms) * _MS)


def span_maker() -> SpanMaker | None:
    """A SpanMaker when ``opentelemetry-api`` is installed, else None (the trace topic still records)."""
    try:
        from opentelemetry import trace as trace_api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return SpanMaker(trace_api, TraceContextTextMapPropagator())
