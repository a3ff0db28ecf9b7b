"""trace_context over the RocketMQ 5 protocol, and the trace plugin's OpenTelemetry spans.

A client's ``trace_context`` (a W3C traceparent) is kept with the message by ``plugmq serve`` and
handed back on receive; with an OpenTelemetry SDK configured in the process, the trace plugin makes
send, store and deliver spans parented on it. A real server thread, raw protocol calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk (the test extra)")

import grpc  # noqa: E402
from opentelemetry import trace as trace_api  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from rocketmq.grpc_protocol import Code, MessagingServiceStub, definition_pb2, service_pb2  # noqa: E402

from plugmq.broker.broker import Broker  # noqa: E402
from plugmq.plugins.trace import recorder  # noqa: E402
from plugmq.server import ServerOptions, ServerThread  # noqa: E402
from tests.test_grpc_protocol import signed  # noqa: E402

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
TIMEOUT = 10


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace_api.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):  # an application configures OpenTelemetry once
        provider = sdk_trace.TracerProvider()
        trace_api.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Broker, Any]]:
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "filter_tag", "trace"], name="otel-broker") as broker:
        broker.create_topic("Traced", 1)
        with ServerThread(broker, ServerOptions(long_polling_s=1.0)) as thread, \
                grpc.insecure_channel(thread.server.address or "") as channel:
            yield broker, MessagingServiceStub(channel)


def test_trace_context_is_kept_handed_back_and_parents_the_spans(served: tuple[Broker, Any],
                                                                 spans: InMemorySpanExporter) -> None:
    broker, stub = served
    message = definition_pb2.Message(body=b"traced order")
    message.topic.name = "Traced"
    message.system_properties.message_id = "01TRACEDMESSAGE0001"
    message.system_properties.trace_context = TRACEPARENT
    sent = stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), metadata=signed(), timeout=TIMEOUT)
    assert sent.status.code == Code.OK, sent.status.message
    request = service_pb2.ReceiveMessageRequest(batch_size=1)
    request.group.name = "tracers"
    request.message_queue.topic.name = "Traced"
    request.invisible_duration.FromSeconds(30)
    answers = list(stub.ReceiveMessage(request, metadata=signed(client_id="consumer-7"), timeout=TIMEOUT))
    received = [a.message for a in answers if a.WhichOneof("content") == "message"]
    assert len(received) == 1
    assert received[0].system_properties.trace_context == TRACEPARENT
    assert "TRACE_CONTEXT" not in received[0].user_properties
    found = recorder(broker.name)
    assert found is not None
    found.flush()
    made = {span.name: span for span in spans.get_finished_spans()
            if span.attributes and span.attributes.get("messaging.message.id") == "01TRACEDMESSAGE0001"}
    assert set(made) == {"send Traced", "store Traced", "deliver Traced"}
    for name in ("send Traced", "deliver Traced"):
        context, parent = made[name].context, made[name].parent
        assert context is not None and context.trace_id == int(TRACE_ID, 16)
        assert parent is not None and parent.span_id == int(PARENT_SPAN, 16)
    store_parent, send_context = made["store Traced"].parent, made["send Traced"].context
    assert store_parent is not None and send_context is not None and store_parent.span_id == send_context.span_id
    delivered = dict(made["deliver Traced"].attributes or {})
    assert delivered["messaging.consumer.group.name"] == "tracers"
    assert delivered["messaging.client.id"] == "consumer-7"
