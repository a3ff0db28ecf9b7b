"""The server enforces the group's back-off on push consumers' nacks, whatever back-off a client applies.

A misbehaving push consumer (like rocketmq-client-nodejs 1.0.8, which ignores the server's custom
back-off) is played through the generated stubs: it registers as PUSH_CONSUMER on its Telemetry
stream and nacks with a 0 s invisible duration. The core pop path keeps the message away for the
policy's back-off, so it reaches the DLQ no sooner than the policy allows; a simple consumer's own
durations are honoured as asked. The broker runs on a ManualClock.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

import grpc
from rocketmq import Credentials
from rocketmq.grpc_protocol import ClientType, Code, MessagingServiceStub, definition_pb2, service_pb2
from rocketmq.v5.util.signature import Signature

from plugmq import Broker, ManualClock
from plugmq.server import ServerOptions, ServerThread

TIMEOUT = 10
TOPIC = "Nacked"
GROUP = "nacky"


class _Client:
    credentials = Credentials()
    namespace = ""


def metadata(client_id: str) -> list[tuple[str, str]]:
    return Signature.metadata(_Client(), client_id)


class Rig:
    def __init__(self, directory: Path) -> None:
        self.clock = ManualClock(start=time.time())
        self.broker = Broker.open(directory, clock=self.clock, plugins=["store_mmap", "filter_tag"],
                                  groups={GROUP: {"max_delivery_attempts": 3, "backoff_s": [10, 30]}})
        self.broker.create_topic(TOPIC, 1)
        self.thread = ServerThread(self.broker, ServerOptions(long_polling_s=0.2))
        self.channel = grpc.insecure_channel(self.thread.start())
        self.stub = MessagingServiceStub(self.channel)
        self._streams: list[tuple[queue.Queue[Any], Any]] = []

    def register(self, client_id: str, client_type: int) -> None:
        """Open the client's Telemetry stream with its settings and keep it open."""
        commands: queue.Queue[Any] = queue.Queue()
        settings = service_pb2.TelemetryCommand()
        settings.settings.client_type = client_type
        settings.settings.subscription.group.name = GROUP
        commands.put(settings)
        call = self.stub.Telemetry(iter(commands.get, None), metadata=metadata(client_id))
        answer = next(call)
        assert answer.status.code == Code.OK
        assert list(answer.settings.backoff_policy.customized_backoff.next) == [
            _duration(10), _duration(30)]  # the group's policy, as the server tells clients
        self._streams.append((commands, call))

    def send(self, body: bytes) -> None:
        message = definition_pb2.Message(body=body)
        message.topic.name = TOPIC
        message.system_properties.message_id = "ID-" + body.decode()
        response = self.stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]),
                                         metadata=metadata("producer"), timeout=TIMEOUT)
        assert response.status.code == Code.OK

    def receive(self, client_id: str) -> list[definition_pb2.Message]:
        request = service_pb2.ReceiveMessageRequest(batch_size=1)
        request.group.name = GROUP
        request.message_queue.topic.name = TOPIC
        request.invisible_duration.FromSeconds(30)
        return [r.message for r in self.stub.ReceiveMessage(request, metadata=metadata(client_id), timeout=TIMEOUT)
                if r.HasField("message")]

    def change(self, client_id: str, message: definition_pb2.Message, seconds: int) -> None:
        request = service_pb2.ChangeInvisibleDurationRequest(group=definition_pb2.Resource(name=GROUP),
                                                             topic=definition_pb2.Resource(name=TOPIC),
                                                             receipt_handle=message.system_properties.receipt_handle,
                                                             message_id=message.system_properties.message_id)
        request.invisible_duration.FromSeconds(seconds)
        response = self.stub.ChangeInvisibleDuration(request, metadata=metadata(client_id), timeout=TIMEOUT)
        assert response.status.code == Code.OK, response.status.message

    def dead_letters(self) -> list[bytes]:
        if self.broker.topics.get("%DLQ%nacky") is None:
            return []
        return [m.body for m in self.broker.pull(self.broker.topic_queues("%DLQ%nacky")[0], 0).messages]

    def close(self) -> None:
        for commands, call in self._streams:
            commands.put(None)
            call.cancel()
        self.channel.close()
        self.thread.stop()
        self.broker.close()


def _duration(seconds: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    duration = Duration()
    duration.FromSeconds(seconds)
    return duration


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path / "data")
    yield r
    r.close()


def test_a_push_consumer_that_ignores_the_back_off_cannot_spin_a_message_into_the_dlq(rig: Rig) -> None:
    rig.register("push-1", ClientType.PUSH_CONSUMER)
    rig.send(b"poison")
    waited = 0
    for attempt, backoff in ((1, 10), (2, 30), (3, 30)):
        (message,) = rig.receive("push-1")
        assert message.system_properties.delivery_attempt == attempt
        rig.change("push-1", message, 0)  # the nack, with no back-off at all
        assert rig.receive("push-1") == []  # not again right away ...
        rig.clock.advance(backoff - 0.5)
        assert rig.receive("push-1") == [] and rig.dead_letters() == []  # ... nor before the policy's back-off
        rig.clock.advance(0.5)
        waited += backoff
    assert rig.dead_letters() == [b"poison"]  # after 10 + 30 + 30 s of the group's back-off, not at once
    assert waited == 70


def test_a_simple_consumers_own_invisible_durations_are_honoured(rig: Rig) -> None:
    rig.register("simple-1", ClientType.SIMPLE_CONSUMER)
    rig.send(b"job")
    (message,) = rig.receive("simple-1")
    rig.change("simple-1", message, 0)  # "give it to someone else now"
    (again,) = rig.receive("simple-1")
    assert again.system_properties.delivery_attempt == 2
    rig.change("simple-1", again, 300)  # "I need longer"
    rig.clock.advance(299)
    assert rig.receive("simple-1") == []
    rig.clock.advance(1)
    assert [m.system_properties.delivery_attempt for m in rig.receive("simple-1")] == [3]


def test_the_same_state_is_seen_from_python(rig: Rig) -> None:
    """The server and a Python simple consumer of one group share the broker's pop state."""
    rig.register("simple-2", ClientType.SIMPLE_CONSUMER)
    rig.send(b"shared")
    (_in_flight,) = rig.receive("simple-2")
    python = rig.broker.simple_consumer(GROUP, {TOPIC: "*"})
    assert python.receive(16, 30) == []  # in flight for the gRPC client
    rig.clock.advance(31)
    (again,) = python.receive(16, 30)
    assert (again.body, again.delivery_attempt) == (b"shared", 2)
    python.ack(again)
    rig.clock.advance(60)
    assert rig.receive("simple-2") == []
