"""Protocol-level answers of ``plugmq serve`` through the client's generated stubs: status codes for
every refusal, UNSUPPORTED for what plugmq does not serve, and access control."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

import grpc
from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.grpc_protocol import (
    ClientType,
    Code,
    MessageType,
    MessagingServiceStub,
    TransactionResolution,
    definition_pb2,
    service_pb2,
)
from rocketmq.v5.exception import ForbiddenException
from rocketmq.v5.util.signature import Signature

from plugmq.broker.broker import Broker
from plugmq.server import ServerOptions, ServerThread, parse_server_table
from tests.helpers.clients import started

TIMEOUT = 10


class _Client:
    """What the signature code needs of a client configuration."""

    def __init__(self, ak: str, sk: str) -> None:
        self.credentials = Credentials(ak, sk)
        self.namespace = ""


def signed(ak: str = "", sk: str = "", client_id: str = "test-client") -> list[tuple[str, str]]:
    return Signature.metadata(_Client(ak, sk), client_id)


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    broker = Broker.open(tmp_path_factory.mktemp("proto") / "data", auto_create_topic=False, max_message_size=1024)
    broker.create_topic("Known", 2)
    broker.create_topic("Quiet", 1)
    thread = ServerThread(broker, ServerOptions(long_polling_s=1.0))
    address = thread.start()
    channel = grpc.insecure_channel(address)
    try:
        yield MessagingServiceStub(channel)
    finally:
        channel.close()
        thread.stop()
        broker.close()


def _send(stub: Any, message: definition_pb2.Message) -> service_pb2.SendMessageResponse:
    return stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), metadata=signed(), timeout=TIMEOUT)


def _message(topic: str = "Known", body: bytes = b"x", kind: int = MessageType.NORMAL, **system: Any
             ) -> definition_pb2.Message:
    message = definition_pb2.Message(body=body)
    message.topic.name = topic
    message.system_properties.message_id = "01ABC"
    message.system_properties.message_type = kind
    for key, value in system.items():
        setattr(message.system_properties, key, value)
    return message


def test_routes_name_this_broker_and_its_queues(stub: Any) -> None:
    request = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="Known"))
    request.endpoints.scheme = definition_pb2.AddressScheme.IPv4
    request.endpoints.addresses.add(host="127.0.0.1", port=1234)
    response = stub.QueryRoute(request, metadata=signed(), timeout=TIMEOUT)
    assert response.status.code == Code.OK
    assert [q.id for q in response.message_queues] == [0, 1]
    queue = response.message_queues[0]
    assert queue.permission == definition_pb2.Permission.READ_WRITE
    assert queue.broker.name == "broker-a" and queue.broker.endpoints.addresses[0].port == 1234
    assert set(queue.accept_message_types) == {MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY,
                                               MessageType.TRANSACTION}


@pytest.mark.parametrize(("topic", "code", "hint"), [
    ("Unknown", Code.TOPIC_NOT_FOUND, "auto_create_topic is off"),
    ("RMQ_SYS_TRANS_HALF_TOPIC", Code.ILLEGAL_TOPIC, "system topics"),
    ("bad topic", Code.ILLEGAL_TOPIC, "contains ' '"),
])
def test_route_refusals(stub: Any, topic: str, code: int, hint: str) -> None:
    response = stub.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)),
                               metadata=signed(), timeout=TIMEOUT)
    assert response.status.code == code and hint in response.status.message


@pytest.mark.parametrize(("message", "code", "hint"), [
    (_message(body=b""), Code.MESSAGE_BODY_EMPTY, "empty"),
    (_message(body=b"x" * 2000), Code.MESSAGE_BODY_TOO_LARGE, "the limit is 1024"),
    (_message(topic="%RETRY%g"), Code.ILLEGAL_TOPIC, "system topic"),
    (_message(topic="Unknown"), Code.TOPIC_NOT_FOUND, "does not exist"),
    (_message(kind=MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "message_group"),
    (_message(kind=MessageType.NORMAL, message_group="g"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "FIFO"),
    (_message(kind=MessageType.LITE), Code.UNSUPPORTED, "LITE"),
    (_message(message_id=""), Code.ILLEGAL_MESSAGE_ID, "message_id is empty"),
    (_message(tag=" "), Code.ILLEGAL_MESSAGE_TAG, "blank"),
])
def test_send_refusals(stub: Any, message: definition_pb2.Message, code: int, hint: str) -> None:
    response = _send(stub, message)
    assert response.status.code == code and hint in response.status.message
    assert response.entries[0].status.code == code


def test_reserved_property_names_are_refused(stub: Any) -> None:
    message = _message()
    message.user_properties["TAGS"] = "sneaky"
    assert _send(stub, message).status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY


def test_send_answers_the_clients_message_id_and_the_offset(stub: Any) -> None:
    response = _send(stub, _message(message_id="CLIENT-ID-1", tag="T"))
    assert response.status.code == Code.OK
    assert response.entries[0].message_id == "CLIENT-ID-1" and response.entries[0].offset >= 0


def test_receive_refusals(stub: Any) -> None:
    short = service_pb2.ReceiveMessageRequest(batch_size=1)
    short.group.name = "grp"
    short.message_queue.topic.name = "Known"
    short.invisible_duration.FromMilliseconds(100)
    (answer,) = stub.ReceiveMessage(short, metadata=signed(), timeout=TIMEOUT)
    assert answer.status.code == Code.ILLEGAL_INVISIBLE_TIME and "min_invisible_s" in answer.status.message
    bad_group = service_pb2.ReceiveMessageRequest(batch_size=1)
    bad_group.group.name = "no spaces"
    bad_group.message_queue.topic.name = "Known"
    (answer,) = stub.ReceiveMessage(bad_group, metadata=signed(), timeout=TIMEOUT)
    assert answer.status.code == Code.ILLEGAL_CONSUMER_GROUP
    unknown = service_pb2.ReceiveMessageRequest(batch_size=1)
    unknown.group.name = "grp"
    unknown.message_queue.topic.name = "Nowhere"
    (answer,) = stub.ReceiveMessage(unknown, metadata=signed(), timeout=TIMEOUT)
    assert answer.status.code == Code.TOPIC_NOT_FOUND


def test_long_polling_ends_with_message_not_found_at_the_polling_time(stub: Any) -> None:
    request = service_pb2.ReceiveMessageRequest(batch_size=1)
    request.group.name = "idle"
    request.message_queue.topic.name = "Quiet"
    request.long_polling_timeout.FromMilliseconds(60_000)  # capped by server.long_polling_s = 1
    (answer,) = stub.ReceiveMessage(request, metadata=signed(), timeout=TIMEOUT)
    assert answer.status.code == Code.MESSAGE_NOT_FOUND


def test_ack_and_change_with_a_foreign_receipt_handle(stub: Any) -> None:
    ack = service_pb2.AckMessageRequest(group=definition_pb2.Resource(name="grp"),
                                        topic=definition_pb2.Resource(name="Known"))
    ack.entries.add(message_id="x", receipt_handle="not-a-handle")
    response = stub.AckMessage(ack, metadata=signed(), timeout=TIMEOUT)
    assert response.status.code == Code.INVALID_RECEIPT_HANDLE
    assert response.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
    change = service_pb2.ChangeInvisibleDurationRequest(group=definition_pb2.Resource(name="grp"),
                                                        topic=definition_pb2.Resource(name="Known"),
                                                        receipt_handle="0:999:1")
    change.invisible_duration.FromSeconds(5)
    assert stub.ChangeInvisibleDuration(change, metadata=signed(), timeout=TIMEOUT).status.code == \
        Code.INVALID_RECEIPT_HANDLE


def test_end_transaction_with_an_unknown_transaction_id(stub: Any) -> None:
    request = service_pb2.EndTransactionRequest(topic=definition_pb2.Resource(name="Known"), message_id="m",
                                                transaction_id="7F00000100002A9F0000000000000000",
                                                resolution=TransactionResolution.COMMIT)
    response = stub.EndTransaction(request, metadata=signed(), timeout=TIMEOUT)
    assert response.status.code == Code.INVALID_TRANSACTION_ID and "no half message" in response.status.message


def test_what_plugmq_does_not_serve_answers_unsupported(stub: Any) -> None:
    queue = definition_pb2.MessageQueue(topic=definition_pb2.Resource(name="Known"))
    group = definition_pb2.Resource(name="grp")
    answers = [
        stub.UpdateOffset(service_pb2.UpdateOffsetRequest(group=group, message_queue=queue), metadata=signed()),
        stub.GetOffset(service_pb2.GetOffsetRequest(group=group, message_queue=queue), metadata=signed()),
        stub.QueryOffset(service_pb2.QueryOffsetRequest(message_queue=queue), metadata=signed()),
        stub.SyncLiteSubscription(service_pb2.SyncLiteSubscriptionRequest(), metadata=signed()),
        *stub.PullMessage(service_pb2.PullMessageRequest(group=group, message_queue=queue), metadata=signed()),
    ]
    assert [a.status.code for a in answers] == [Code.UNSUPPORTED] * 5


def test_telemetry_settings_exchange_and_unsupported_commands(stub: Any) -> None:
    producer = service_pb2.TelemetryCommand()
    producer.settings.client_type = ClientType.PRODUCER
    producer.settings.publishing.topics.add(name="Known")
    pull = service_pb2.TelemetryCommand()
    pull.settings.client_type = ClientType.PULL_CONSUMER
    push = service_pb2.TelemetryCommand()
    push.settings.client_type = ClientType.PUSH_CONSUMER
    push.settings.subscription.group.name = "grp"
    odd = service_pb2.TelemetryCommand()
    odd.print_thread_stack_trace_command.nonce = "n"
    commands = [producer, pull, push, odd]
    answers: list[Any] = []
    call = stub.Telemetry(iter(commands), metadata=signed(), timeout=TIMEOUT)
    for answer in call:
        answers.append(answer)
        if len(answers) == len(commands):
            call.cancel()
            break
    assert [a.status.code for a in answers] == [Code.OK, Code.UNSUPPORTED, Code.OK, Code.UNSUPPORTED]
    assert answers[0].settings.publishing.max_body_size == 1024
    assert answers[2].settings.backoff_policy.max_attempts == 17
    assert answers[2].settings.subscription.long_polling_timeout.seconds == 1
    assert "PULL_CONSUMER" in answers[1].status.message


# ------------------------------------------------------------------------------------- ACL
ACL = parse_server_table({
    "long_polling_s": 1,
    "acl": {"enabled": True, "accounts": {
        "writer": {"secret": "w-secret", "publish": ["Open"], "subscribe": ["*"]},
        "reader": {"secret": "r-secret", "subscribe": ["Open"]},
    }},
})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    broker = Broker.open(tmp_path_factory.mktemp("acl") / "data")
    broker.create_topic("Open", 1)
    thread = ServerThread(broker, ACL)
    address = thread.start()
    channel = grpc.insecure_channel(address)
    try:
        yield address, MessagingServiceStub(channel)
    finally:
        channel.close()
        thread.stop()
        broker.close()


@pytest.mark.parametrize(("metadata", "code", "hint"), [
    ([], Code.UNAUTHORIZED, "carries no signature"),
    (signed("nobody", "x"), Code.UNAUTHORIZED, "unknown"),
    (signed("writer", "wrong"), Code.UNAUTHORIZED, "does not match"),
    (signed("reader", "r-secret"), Code.FORBIDDEN, "may not publish to topic 'Open'"),
    (signed("writer", "w-secret"), Code.OK, "OK"),
])
def test_signatures_and_permissions(secured: tuple[str, Any], metadata: list[tuple[str, str]], code: int,
                                    hint: str) -> None:
    _, acl_stub = secured
    request = service_pb2.SendMessageRequest(messages=[_message(topic="Open")])
    response = acl_stub.SendMessage(request, metadata=metadata, timeout=TIMEOUT)
    assert response.status.code == code and hint in response.status.message


def test_official_client_with_credentials(secured: tuple[str, Any]) -> None:
    address, _ = secured

    def client_message(body: bytes) -> Message:
        message = Message()
        message.topic = "Open"
        message.body = body
        return message

    with started(Producer(ClientConfiguration(address, Credentials("writer", "w-secret")), ("Open",))) as good:
        assert good.send(client_message(b"signed")).message_id
    with started(Producer(ClientConfiguration(address, Credentials("reader", "r-secret")), ("Open",))) as reader:
        with pytest.raises(ForbiddenException) as caught:
            reader.send(client_message(b"not allowed"))
        assert caught.value.code == Code.FORBIDDEN
