"""The server's own parts of serving: the protocol loaded without the client library, the body
digest every client verifies, and SendMessage calls stored as store batches."""

from __future__ import annotations

import array
import asyncio
import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")

import grpc

from plugmq.broker.broker import Broker
from plugmq.core.appendcolumns import AppendColumns
from plugmq.core.message import AppendRequest, AppendResult, AppendStatus, MessageQueue, SendResults, SendStatus
from plugmq.core.names import Prop
from plugmq.server import ServerOptions, ServerThread
from plugmq.server.acl import Account, AclOptions
from plugmq.server.auth import Authenticator
from plugmq.server.convert import body_digest, to_proto
from plugmq.server.protocol import Code, DigestType, MessageType, MessagingServiceStub, definition_pb2, service_pb2

TIMEOUT = 10


def test_importing_the_server_loads_the_protocol_but_not_the_client_library() -> None:
    script = ("import sys, plugmq.server\n"
              "from plugmq.server.protocol import service_pb2\n"
              "loaded = sorted(n for n in sys.modules if n.startswith(('rocketmq', 'opentelemetry')))\n"
              "print(' '.join(loaded))\n"
              "from rocketmq import Producer\n"  # the client still imports, and shares the generated modules
              "from rocketmq.grpc_protocol import service_pb2 as theirs\n"
              "assert theirs is service_pb2\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "rocketmq.grpc_protocol.service_pb2" in loaded
    assert not {n for n in loaded if not n.startswith("rocketmq.grpc_protocol")}, "the client library was imported"


def test_enum_constants_are_the_protocols_numbers() -> None:
    assert definition_pb2.Code.Value("OK") == Code.OK
    assert MessageType.Name(MessageType.FIFO) == "FIFO"
    assert DigestType.MD5 in DigestType.values()


@pytest.mark.parametrize("body", [b"x", b"foobar", bytes(range(256)) * 3, "ünïcode".encode()])
def test_body_digest_is_what_every_official_client_verifies(body: bytes) -> None:
    misc = pytest.importorskip("rocketmq.v5.util.misc", reason="the Python client checks its own rule")
    expected = hashlib.md5(body).hexdigest().upper()  # Java, Go and Node.js compute it this way too
    assert body_digest(body) == expected == misc.Misc.md5_checksum(body)
    if body == b"foobar":
        assert expected == "3858F62230AC3C915F300C664312C63F"  # the Java client's own test vector


@pytest.fixture
def served(tmp_path: Any) -> Iterator[tuple[Broker, Any]]:
    broker = Broker.open(tmp_path / "data", max_message_size=4096)
    broker.create_topic("Batched", 4)
    thread = ServerThread(broker, ServerOptions(long_polling_s=1.0))
    address = thread.start()
    channel = grpc.insecure_channel(address)
    try:
        yield broker, MessagingServiceStub(channel)
    finally:
        channel.close()
        thread.stop()
        broker.close()


def _message(message_id: str, body: bytes = b"body", group: str | None = None, topic: str = "Batched"
             ) -> definition_pb2.Message:
    message = definition_pb2.Message(body=body)
    message.topic.name = topic
    message.system_properties.message_id = message_id
    message.system_properties.message_type = MessageType.FIFO if group else MessageType.NORMAL
    if group:
        message.system_properties.message_group = group
    return message


def _send(stub: Any, *messages: definition_pb2.Message) -> Any:
    return stub.SendMessage(service_pb2.SendMessageRequest(messages=messages), timeout=TIMEOUT)


def test_messages_of_one_call_for_one_queue_are_stored_in_order(served: tuple[Broker, Any]) -> None:
    broker, stub = served
    response = _send(stub, *(_message(f"id-{i}", f"m{i}".encode(), group="g1") for i in range(6)))
    assert response.status.code == Code.OK
    assert [e.message_id for e in response.entries] == [f"id-{i}" for i in range(6)]
    offsets = [e.offset for e in response.entries]
    assert offsets == list(range(offsets[0], offsets[0] + 6))
    queue = next(q for q in broker.topic_queues("Batched") if broker.max_offset(q) == 6)
    stored = broker.pull(queue, 0, 16).messages
    assert [m.body for m in stored] == [f"m{i}".encode() for i in range(6)]
    assert [m.unique_id for m in stored] == [f"id-{i}" for i in range(6)]
    assert {m.properties.get(Prop.SHARDING_KEY) for m in stored} == {"g1"}


def test_a_bad_message_fails_alone_and_the_rest_of_the_call_is_stored(served: tuple[Broker, Any]) -> None:
    broker, stub = served
    response = _send(stub, _message("ok-1"), _message("bad", b""), _message("ok-2"),
                     _message("big", b"x" * 5000), _message("system", topic="%DLQ%grp"))
    codes = [e.status.code for e in response.entries]
    assert codes == [Code.OK, Code.MESSAGE_BODY_EMPTY, Code.OK, Code.MESSAGE_BODY_TOO_LARGE, Code.ILLEGAL_TOPIC]
    assert [e.message_id for e in response.entries] == ["ok-1", "bad", "ok-2", "big", "system"]
    assert response.status.code == Code.MULTIPLE_RESULTS
    assert sum(broker.max_offset(q) for q in broker.topic_queues("Batched")) == 2


def test_concurrent_calls_are_all_stored_once(served: tuple[Broker, Any]) -> None:
    broker, stub = served
    failures: list[str] = []

    def work(index: int) -> None:
        for i in range(25):
            response = _send(stub, _message(f"c{index}-{i}"), _message(f"c{index}-{i}b"))
            if response.status.code != Code.OK:
                failures.append(response.status.message)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stored = [str(m.unique_id) for q in broker.topic_queues("Batched") for m in broker.pull(q, 0, 1000).messages]
    assert sorted(stored) == sorted(f"c{n}-{i}{s}" for n in range(8) for i in range(25) for s in ("", "b"))


def test_a_retried_send_is_answered_with_the_stored_message_not_stored_twice(served: tuple[Broker, Any]) -> None:
    """The official clients retry a failed or timed-out send with the same message id; a retry of
    what this broker stored already (its answer lost, or not confirmed in time) is answered from it."""
    broker, stub = served
    first = _send(stub, _message("retried", b"once"))
    again = _send(stub, _message("retried", b"once"), _message("fresh", b"new"))
    assert first.status.code == Code.OK and [e.status.code for e in again.entries] == [Code.OK, Code.OK]
    assert again.entries[0].offset == first.entries[0].offset
    stored = [str(m.unique_id) for q in broker.topic_queues("Batched") for m in broker.pull(q, 0, 1000).messages]
    assert sorted(stored) == ["fresh", "retried"]


def test_sends_are_stored_on_the_loop_only_while_the_send_thread_has_no_call(tmp_path: Any) -> None:
    """A page-cache append costs less on the event loop than the hop to the send thread, but only
    where nothing can wait (no sync flush, no replication, no delay or transaction plugin) and never
    past a call the thread still holds: a client's retry must find its first try in RecentSends."""
    from plugmq.server.send import Sender, SendRequest, check_send
    from plugmq.server.sendworker import SendWorker
    from plugmq.server.telemetry import Sessions

    broker = Broker.open(tmp_path / "data", max_message_size=4096)
    broker.create_topic("Batched", 4)
    auth = Authenticator(AclOptions())
    delayed = _message("later")
    delayed.system_properties.message_type = MessageType.DELAY
    delayed.system_properties.delivery_timestamp.FromMilliseconds(broker.clock.now_ms() + 60_000)

    async def check() -> None:
        worker = SendWorker(Sender(broker, Sessions(broker, ServerOptions()), auth, 4096), asyncio.get_running_loop())
        try:
            first = check_send(SendRequest([_message("first")], None, "c"), auth, 4096)
            assert not broker.sends_wait  # an async-flush store without replication
            assert worker.stores_on_loop([first], broker.sends_wait)
            assert not worker.stores_on_loop([first], sends_wait=True)
            assert not worker.stores_on_loop([check_send(SendRequest([delayed], None, "c"), auth, 4096)], False)
            stored = worker.submit(first)
            assert not worker.stores_on_loop([first], False)  # the thread's call is stored first
            offset = (await stored).entries[0].offset
            assert worker.stores_on_loop([first], False)
            retried = worker.sender.store([first])[0].entries  # the retry, on the loop, finds the first try
            assert retried[0].status.code == Code.OK and retried[0].offset == offset
        finally:
            worker.close()

    try:
        asyncio.run(check())
        stored = [m.unique_id for q in broker.topic_queues("Batched") for m in broker.pull(q, 0, 100).messages]
        assert stored == ["first"]
    finally:
        broker.close()


def test_delivered_messages_carry_the_md5_digest(served: tuple[Broker, Any]) -> None:
    broker, stub = served
    assert _send(stub, _message("digest", b"\x00\x01payload")).status.code == Code.OK
    queue = next(q for q in broker.topic_queues("Batched") if broker.max_offset(q))
    (stored,) = broker.pull(queue, 0, 1).messages
    digest = to_proto(stored).system_properties.body_digest
    assert digest.type == DigestType.MD5 and digest.checksum == hashlib.md5(b"\x00\x01payload").hexdigest().upper()


_TOPICS = st.sampled_from(["Batched", "Other", "Forbidden", "%DLQ%grp", "SCHEDULE_TOPIC_XXXX", "bad topic!"])


@settings(max_examples=60, deadline=None)
@given(topics=st.lists(_TOPICS, min_size=1, max_size=10), bodies=st.lists(st.sampled_from([b"x", b"", b"y" * 5000]),
                                                                       min_size=10, max_size=10))
def test_a_calls_topic_checks_once_per_topic_answer_as_each_messages_own(topics: list[str],
                                                                         bodies: list[bytes]) -> None:
    """check_messages checks the right to publish and the system topics once per topic of a call:
    every message gets what check_message, run on it alone, answers."""
    from plugmq.server.send import check_message, check_messages
    from plugmq.server.status import status_of

    account = attrs.evolve(Account(secret="s3cret", publish=frozenset({"Batched", "Other", "%DLQ%grp"})),
                           access_key="producer-1")
    auth = Authenticator(AclOptions(enabled=True, accounts={"producer-1": account}))
    protos = [_message(f"m{i}", bodies[i], topic=topic) for i, topic in enumerate(topics)]
    checked = check_messages(protos, account, auth, 4096)
    for proto, item in zip(protos, checked.items, strict=True):
        try:
            alone: Any = check_message(proto, account, auth, 4096)
        except Exception as exc:  # noqa: BLE001 - compared as the entry it answers
            assert isinstance(item, service_pb2.SendResultEntry)
            assert item.message_id == proto.system_properties.message_id
            assert item.status == status_of(exc, action=f"send to topic {proto.topic.name!r}")
        else:
            assert item == alone


_APPEND_STATUSES = st.sampled_from(list(AppendStatus))


@settings(max_examples=80, deadline=None)
@given(offsets=st.lists(st.integers(0, 2**40), max_size=12), statuses=st.data(), columns=st.booleans(),
       replica=st.sampled_from(list(SendStatus)))
def test_send_results_columns_answer_as_the_results_they_build(offsets: list[int], statuses: st.DataObject,
                                                               columns: bool, replica: SendStatus) -> None:
    """SendResults.queue_offsets and shared_status (what the server answers from, no SendResult
    built) say what reading each result says, from a store's columns or a list of results."""
    queue = MessageQueue("T", "b", 0)
    requests = [AppendRequest("T", 0, b"x", {Prop.UNIQ_KEY: f"u{i}"}) for i in range(len(offsets))]
    if columns:
        status = statuses.draw(_APPEND_STATUSES)
        rows = [value for i, offset in enumerate(offsets) for value in (offset, 1000 * i, 100)]
        stored: Any = AppendColumns(memoryview(array.array("q", rows)).cast("B").cast("q"), "P" * 16, 5, status)
    else:
        stored = [AppendResult(statuses.draw(_APPEND_STATUSES), f"id{i}", offset, 1000 * i, 100, 5)
                  for i, offset in enumerate(offsets)]
    results = SendResults(stored, requests, queue, replica)
    built = list(results)
    assert results.queue_offsets() == [result.queue_offset for result in built] == offsets
    shared = {result.status for result in built}
    assert results.shared_status() == (shared.pop() if len(shared) == 1 else None)


_FIELDS = st.fixed_dictionaries({}, optional={
    "tag": st.sampled_from(["TagA", "", " ", "a\nb", "t" * 1100]), "keys": st.lists(st.sampled_from(["k1", "", "a b"]),
                                                                                      max_size=2),
    "props": st.dictionaries(st.sampled_from(["a", "UNIQ_KEY", "b"]), st.sampled_from(["1", "x y"]), max_size=2),
    "type": st.sampled_from([MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.PRIORITY, 99]),
    "group": st.sampled_from(["g-1", "", "g\n"]), "at": st.sampled_from([4_000_000_000_000, 10**15]),
    "priority": st.integers(-1, 3), "trace": st.sampled_from(["00-ab-cd-01", ""]),
    "body": st.sampled_from([b"", b"x", b"y" * 5000]), "id": st.sampled_from(["", " ", "m\x01", "i" * 130]),
    "topic": st.sampled_from(["Other", "bad topic!", ""]), "gzip": st.booleans()})


@settings(max_examples=120, deadline=None)
@given(fields=_FIELDS)
def test_outgoing_is_the_same_with_or_without_the_compiled_slot_filler(fields: dict[str, Any]) -> None:
    """outgoing() fills an Outgoing's slots in one compiled call: the same value, or the same
    refusal, as attrs' own init gives."""
    import gzip

    from plugmq.core import message as core_message
    from plugmq.server.convert import outgoing
    from plugmq.server.protocol import Encoding
    from plugmq.server.status import status_of

    proto = _message(fields.get("id", "m-1"), fields.get("body", b"body"), topic=fields.get("topic", "Batched"))
    props = proto.system_properties
    props.message_type = fields.get("type", MessageType.NORMAL)
    for name in ("tag", "group", "priority", "trace"):
        if name in fields:
            setattr(props, {"group": "message_group", "trace": "trace_context"}.get(name, name), fields[name])
    props.keys.extend(fields.get("keys", ()))
    if "at" in fields:
        props.delivery_timestamp.seconds = fields["at"] // 1000  # 10**12 s: milliseconds in the seconds field
    if fields.get("gzip"):
        proto.body, props.body_encoding = gzip.compress(proto.body), Encoding.GZIP
    proto.user_properties.update(fields.get("props", {}))
    answers = []
    compiled = core_message.slot_filler()
    for fill in (compiled, None):
        core_message.install_slot_filler(fill)
        try:
            answers.append(outgoing(proto, 4096))
        except Exception as exc:  # noqa: BLE001 - compared as the status it answers
            answers.append(status_of(exc, action="send"))
        finally:
            core_message.install_slot_filler(compiled)
    assert answers[0] == answers[1]


_PLACED = st.tuples(st.sampled_from(["Batched", "Other", "Unknown"]), st.integers(1, 40),
                    st.sampled_from(["plain", "plain", "plain", "fifo", "due", "empty"]), st.integers(0, 12))


_ROUNDS = st.lists(st.lists(st.lists(_PLACED, min_size=1, max_size=6), min_size=1, max_size=3), min_size=1, max_size=4)


def test_plain_calls_placed_in_one_step_answer_and_store_as_message_by_message(tmp_path: Any) -> None:
    """Sender places a call of plain messages for one topic in one step: the same answers, the
    same records on the same queues as placing it message by message (retries, batches split at
    the batch size, FIFO, due delayed and refused messages, a topic that does not exist)."""
    import itertools

    from plugmq.server.send import Sender, check_messages
    from plugmq.server.telemetry import Sessions

    class MessageByMessage(Sender):
        def _place_plain(self, *args: Any) -> bool:
            return False

    auth = Authenticator(AclOptions())
    brokers = [Broker.open(tmp_path / name, max_message_size=4096, auto_create_topic=False)
               for name in ("one-step", "by-message")]
    examples = itertools.count()

    @settings(max_examples=15, deadline=None)
    @given(rounds=_ROUNDS)
    def check(rounds: list[list[list[tuple[str, int, str, int]]]]) -> None:
        topics = {name: f"{name}{next(examples)}" for name in ("Batched", "Other", "Unknown")}  # each its own
        seen = []
        for kind, broker in zip((Sender, MessageByMessage), brokers, strict=True):
            for name in ("Batched", "Other"):  # no Unknown: its sends are refused (TOPIC_NOT_FOUND)
                broker.create_topic(topics[name], 2)
            sender = kind(broker, Sessions(broker, ServerOptions()), auth, 64)
            answers: list[bytes] = []
            for calls in rounds:
                checked = [check_messages([_placed(topics[t], size, how, n) for t, size, how, n in call], None, auth, 4096)
                           for call in calls]
                answers.extend(response.SerializeToString() for response in sender.store(checked))
            stored = [[(str(m.unique_id), m.body) for m in broker.pull(queue, 0, 1000).messages]
                      for name in ("Batched", "Other") for queue in broker.topic_queues(topics[name])]
            seen.append((answers, stored))
        assert seen[0] == seen[1]

    try:
        check()
    finally:
        for broker in brokers:
            broker.close()


def _placed(topic: str, size: int, kind: str, number: int) -> definition_pb2.Message:
    """A message of the one-step placing test: ``kind`` plain, fifo, due (delayed, already due) or
    empty (refused)."""
    message = _message(f"id-{number}", b"" if kind == "empty" else bytes([number]) * size,
                       group="g-1" if kind == "fifo" else None, topic=topic)
    if kind == "due":  # a delayed message already due: stored as a normal one
        message.system_properties.message_type = MessageType.DELAY
        message.system_properties.delivery_timestamp.FromMilliseconds(1_000_000)
    return message


_PROPERTIES = st.dictionaries(
    st.sampled_from([Prop.TAGS, Prop.KEYS, Prop.UNIQ_KEY, Prop.SHARDING_KEY, Prop.PRIORITY, Prop.TRACE_CONTEXT,
                     "user-a", "user-b"]),
    st.sampled_from(["", "v", "k1 k2", "7", "00-ab-cd-01"]), max_size=8)


@settings(max_examples=150, deadline=None)
@given(properties=_PROPERTIES, sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC]),
       born=st.integers(0, 253_402_300_799_999), stored_at=st.sampled_from([0, 1, 1_700_000_000_123]),
       handle=st.sampled_from([None, "h~mac"]), attempt=st.sampled_from([None, 1, 3]),
       invisible=st.sampled_from([None, 0, 30_000]), namespace=st.sampled_from(["", "ns"]))
def test_a_stored_message_is_delivered_with_every_field_it_holds(
        properties: dict[str, str], sys_flag: int, born: int, stored_at: int, handle: str | None,
        attempt: int | None, invisible: int | None, namespace: str) -> None:
    """to_proto reads each property once: what it delivers is what the stored message says."""
    from plugmq.core.message import StoredMessage, encode_msg_id
    from plugmq.core.names import SYSTEM_PROPERTY_KEYS

    stored = StoredMessage("T", 2, b"payload", properties, 9, 4096, 120, 0, born, stored_at, "10.0.0.1:9",
                           "10.0.0.2:10911", sys_flag=sys_flag)
    proto = service_pb2.ReceiveMessageResponse().message
    to_proto(stored, namespace=namespace, receipt_handle=handle, attempt=attempt, invisible_ms=invisible, into=proto)
    props = proto.system_properties
    assert (proto.topic.name, proto.topic.resource_namespace, proto.body) == ("T", namespace, b"payload")
    assert dict(proto.user_properties) == {k: v for k, v in properties.items() if k not in SYSTEM_PROPERTY_KEYS}
    assert (props.tag if props.HasField("tag") else None) == properties.get(Prop.TAGS)
    assert list(props.keys) == properties.get(Prop.KEYS, "").split()
    assert props.message_id == (properties.get(Prop.UNIQ_KEY) or encode_msg_id("10.0.0.2:10911", 4096))
    assert props.body_digest.checksum == body_digest(b"payload") and props.body_digest.type == DigestType.MD5
    kind = (MessageType.FIFO if properties.get(Prop.SHARDING_KEY) else MessageType.PRIORITY
            if Prop.PRIORITY in properties else MessageType.TRANSACTION if sys_flag & 0x8 else MessageType.NORMAL)
    assert props.message_type == kind
    assert (props.born_timestamp.ToMilliseconds(), props.store_timestamp.ToMilliseconds()) == (born, stored_at)
    assert (props.born_host, props.store_host, props.queue_id, props.queue_offset) == ("10.0.0.1:9", "10.0.0.2:10911",
                                                                                       2, 9)
    assert props.message_group == (properties.get(Prop.SHARDING_KEY) or "")
    priority = properties.get(Prop.PRIORITY)
    assert (props.priority if props.HasField("priority") else None) == (
        int(priority) if priority is not None and priority.isdigit() else None)
    assert props.trace_context == (properties.get(Prop.TRACE_CONTEXT) or "")
    assert (props.receipt_handle if props.HasField("receipt_handle") else None) == handle
    assert (props.delivery_attempt if props.HasField("delivery_attempt") else None) == attempt
    assert (props.invisible_duration.ToMilliseconds() if props.HasField("invisible_duration") else None) == invisible


def test_a_time_outside_a_timestamps_range_is_refused_as_before() -> None:
    from plugmq.core.message import StoredMessage

    stored = StoredMessage("T", 0, b"x", {}, 0, 0, 1, 0, 253_402_300_800_000, 0, "10.0.0.1:9", "10.0.0.2:1")
    with pytest.raises(ValueError, match="Timestamp is not valid"):
        to_proto(stored)


def test_a_plain_call_to_a_topic_that_does_not_exist_is_refused_entry_by_entry(tmp_path: Any) -> None:
    from plugmq.server.send import Sender, check_messages
    from plugmq.server.telemetry import Sessions

    broker = Broker.open(tmp_path / "data", auto_create_topic=False)
    try:
        auth = Authenticator(AclOptions())
        sender = Sender(broker, Sessions(broker, ServerOptions()), auth, 4096)
        call = check_messages([_message("a", topic="Nowhere"), _message("b", topic="Nowhere")], None, auth, 4096)
        (response,) = sender.store([call])
        assert [e.message_id for e in response.entries] == ["a", "b"]
        assert {e.status.code for e in response.entries} == {Code.TOPIC_NOT_FOUND}
        assert response.status.code != Code.OK
    finally:
        broker.close()
