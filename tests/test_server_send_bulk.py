"""SendMessage's bulk path answers as the message-by-message one: a call's plain messages are
converted without their topic's and tag's checks repeated (check_messages), and a plain call is
stored from its columns (Sender._place_plain). Mixed calls of good and bad messages get the same
entry for each message either way."""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")

from plugmq.broker.broker import Broker
from plugmq.core.message import Message
from plugmq.server import ServerOptions
from plugmq.server.acl import Account, AclOptions
from plugmq.server.auth import Authenticator
from plugmq.server.convert import ProvenKey, is_plain, outgoing, plain_outgoing
from plugmq.server.dedupe import RecentSends
from plugmq.server.protocol import Encoding, MessageType, definition_pb2
from plugmq.server.send import Sender
from plugmq.server.sendcheck import CheckedSend, check_message, check_messages, failed_entry
from plugmq.server.telemetry import Sessions

_MAX_BODY = 4096
_ACCOUNT = attrs.evolve(Account(secret="s3cret", publish=frozenset({"Batched", "Other", "%DLQ%grp"})),
                        access_key="producer-1")
_AUTH = Authenticator(AclOptions(enabled=True, accounts={"producer-1": _ACCOUNT}))

_TOPICS = st.sampled_from(["Batched", "Batched", "Batched", "Other", "Forbidden", "%DLQ%grp", "bad topic!", ""])
_IDS = st.sampled_from(["", " ", "a\nb", "x" * 129, "ok"])
_TAGS = st.sampled_from([None, None, "", "TagA", "TagA", "TagB", "a\nb", "x" * 1025, "A||B"])
_TYPES = st.sampled_from([0, MessageType.NORMAL, MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY,
                          MessageType.TRANSACTION, MessageType.PRIORITY, 5, 99])
_BODIES = st.sampled_from([b"body", b"body", b"", b"y" * 5000, gzip.compress(b"zipped"), b"not gzip"])


@st.composite
def _messages(draw: st.DrawFn, index: int, clean: bool = False) -> definition_pb2.Message:
    """A sent message: a plain good one (``clean``) or one wrong in any number of ways."""
    if clean:
        message = definition_pb2.Message(body=b"body %d" % index)
        message.topic.name = "Batched"
        message.system_properties.message_id = f"m{index}"
        message.system_properties.message_type = draw(st.sampled_from([0, MessageType.NORMAL]))
        tag = draw(st.sampled_from([None, "TagA", "TagB"]))
        if tag is not None:
            message.system_properties.tag = tag
        if draw(st.booleans()):
            message.system_properties.trace_context = "00-trace-01"
        return message
    message = definition_pb2.Message(body=draw(_BODIES))
    message.topic.name = draw(_TOPICS)
    props = message.system_properties
    message_id = draw(_IDS)
    props.message_id = f"m{index}" if message_id == "ok" else message_id
    props.message_type = draw(_TYPES)
    tag = draw(_TAGS)
    if tag is not None:
        props.tag = tag
    encoding = draw(st.sampled_from([0, Encoding.IDENTITY, Encoding.IDENTITY, Encoding.GZIP]))
    props.body_encoding = encoding
    if draw(st.integers(0, 9)) == 0:
        props.keys.extend(draw(st.sampled_from([["k1"], ["k 2"], [""]])))
    if draw(st.integers(0, 9)) == 0:
        message.user_properties.update(draw(st.sampled_from([{"a": "b"}, {"UNIQ_KEY": "x"}])))
    if draw(st.integers(0, 9)) == 0:
        props.message_group = draw(st.sampled_from(["g", "", "g\n"]))
    if draw(st.integers(0, 9)) == 0:
        props.delivery_timestamp.seconds = draw(st.sampled_from([1_900_000_000, 10**12]))
    if draw(st.integers(0, 9)) == 0:
        props.priority = draw(st.sampled_from([0, 3, -1]))
    if draw(st.booleans()):
        props.trace_context = "00-trace-01"
    return message


@st.composite
def _calls(draw: st.DrawFn) -> list[definition_pb2.Message]:
    """A call: its messages plain and good but for the ``dirty`` one in a clean call (the bulk
    path's common case, and a bad message among good ones), else each one drawn freely."""
    count = draw(st.integers(1, 12))
    clean = draw(st.booleans())
    dirty = draw(st.integers(-1, count - 1)) if clean else -2
    return [draw(_messages(index, clean=clean and index != dirty)) for index in range(count)]


def _one_by_one(protos: list[definition_pb2.Message], account: Account | None) -> list[Any]:
    """Each message checked alone: its Outgoing or the entry that answers its failure."""
    items: list[Any] = []
    for proto in protos:
        try:
            items.append(check_message(proto, account, _AUTH, _MAX_BODY))
        except Exception as exc:  # noqa: BLE001 - compared as the entry it answers
            items.append(failed_entry(proto.topic.name, proto.system_properties.message_id, exc))
    return items


@settings(max_examples=300, deadline=None)
@given(protos=_calls())
def test_a_calls_bulk_check_answers_each_message_as_its_own_check(protos: list[definition_pb2.Message]) -> None:
    checked = check_messages(protos, _ACCOUNT, _AUTH, _MAX_BODY, "client-1")
    alone = _one_by_one(protos, _ACCOUNT)
    assert list(checked.items) == alone
    rebuilt = CheckedSend(alone, "client-1", "producer-1")  # what the call's flags and columns are, from its items
    assert (checked.on_loop, checked.transactional, checked.plain) == (
        rebuilt.on_loop, rebuilt.transactional, rebuilt.plain)


@settings(max_examples=200, deadline=None)
@given(proto=_messages(0), proven_by=_messages(1))
def test_a_plain_message_converts_as_outgoing_converts_it(proto: definition_pb2.Message,
                                                          proven_by: definition_pb2.Message) -> None:
    """plain_outgoing answers what outgoing() answers, or None (outgoing() then checks it)."""
    try:
        proven = outgoing(proven_by, _MAX_BODY)
    except Exception:  # noqa: BLE001 - a bad message proves nothing
        return
    if not is_plain(proven):
        return
    converted = plain_outgoing(proto, {(proven.message.topic, proven.message.tags): proven.message})
    if converted is not None:
        assert converted == outgoing(proto, _MAX_BODY)
        assert is_plain(converted)


def test_a_plain_message_with_a_proven_topic_and_tag_skips_only_those_checks() -> None:
    good = definition_pb2.Message(body=b"b")
    good.topic.name = "Batched"
    good.system_properties.message_id = "m1"
    good.system_properties.tag = "TagA"
    proven = outgoing(good)
    known: dict[ProvenKey, Message] = {("Batched", "TagA"): proven.message}
    assert plain_outgoing(good, known) == proven
    assert plain_outgoing(good, {}) is None  # nothing proven: outgoing() checks it all
    other_tag = definition_pb2.Message()
    other_tag.CopyFrom(good)
    other_tag.system_properties.tag = "TagB"
    assert plain_outgoing(other_tag, known) is None
    for field, value in (("message_id", ""), ("message_id", "a\nb"), ("message_group", "g"), ("priority", 1)):
        bad = definition_pb2.Message()
        bad.CopyFrom(good)
        setattr(bad.system_properties, field, value)
        assert plain_outgoing(bad, known) is None, field
    empty = definition_pb2.Message()
    empty.CopyFrom(good)
    empty.body = b""
    assert plain_outgoing(empty, known) is None


def test_the_dedupe_window_keeps_the_last_sends_across_generations() -> None:
    from plugmq.core.clock import ManualClock

    recent = RecentSends(ManualClock(), lambda: None, lambda *_: None, remembered=4)
    recent.stored_many(["a", "b", "c"], [1, 2, 3])
    recent.stored_many(["d", "e"], [4, 5])  # the newer generation is full: it becomes the older one
    recent.stored_many(["b"], [9])  # stored again: the newer offset answers
    assert [recent.find(i, "T") for i in "abcdef"] == [1, 9, 3, 4, 5, None]
    assert recent.may_know(["x", "e"]) and not recent.may_know(["x", "y"])
    recent.stored_many(["f", "g", "h"], [6, 7, 8])  # the newer generation is full again: a, c... dropped
    assert [recent.find(i, "T") for i in "abcdefgh"] == [None, 9, None, None, None, 6, 7, 8]


@pytest.fixture(scope="module")
def two_senders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[tuple[Sender, Broker], ...]]:
    """Two brokers alike, each with its Sender: one stores calls in bulk, one message by message."""
    root: Path = tmp_path_factory.mktemp("bulk")
    brokers = [Broker.open(root / name, max_message_size=_MAX_BODY) for name in ("bulk", "single")]
    for broker in brokers:
        broker.create_topic("Batched", 2)
    try:
        yield tuple((Sender(b, Sessions(b, ServerOptions()), _AUTH, 3 * _MAX_BODY), b) for b in brokers)
    finally:
        for broker in brokers:
            broker.close()


_CALL_NUMBERS = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(protos=_calls(), retry=st.booleans())
def test_a_plain_call_stores_as_its_messages_one_by_one(two_senders: tuple[tuple[Sender, Broker], ...],
                                                        protos: list[definition_pb2.Message], retry: bool) -> None:
    """The same call to two brokers alike: stored from its columns (bulk) and message by message
    (no columns: Sender._place), the responses are equal, and so are the stored messages."""
    (bulk, _), (single, _) = two_senders
    call = next(_CALL_NUMBERS)
    for proto in protos:  # ids unique across examples: a retry is only the one asked for
        proto.system_properties.message_id = f"{call}-{proto.system_properties.message_id}"
    calls = [check_messages(protos, _ACCOUNT, _AUTH, _MAX_BODY, "client-1")]
    if retry:
        calls.append(calls[0])  # the whole call again: its messages are answered as stored, not stored twice
    one_by_one = [attrs.evolve(checked, plain=None) for checked in calls]
    for bulk_call, single_call in zip(calls, one_by_one, strict=True):
        assert bulk.store([bulk_call]) == single.store([single_call])
    pulled = []
    for _, broker in two_senders:
        pulled.append([(m.queue_id, m.queue_offset, m.body, m.unique_id, m.tags)
                       for q in broker.topic_queues("Batched") for m in broker.pull(q, 0, 10_000).messages])
    assert pulled[0] == pulled[1]
