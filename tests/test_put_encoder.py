"""The put path's batch encoder (plugmq.kit.requestcodec.encode_messages): the compiled encoder
against its Python twin, the same stored messages either way, the same errors, and SendResults."""

from __future__ import annotations

import itertools
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.broker import Broker
from plugmq.core import Message, Prop
from plugmq.core.appendcolumns import AppendColumns
from plugmq.core.errors import MessageTooLargeError, ValidationError
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    MessageQueue,
    SendResult,
    SendResults,
    SendStatus,
    new_unique_id,
)
from plugmq.kit import requestcodec

native = pytest.mark.skipif(not requestcodec.native_available(), reason="plugmq.kit._requestcodec was not built")

_word = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF, categories=["L", "N", "P", "S"],
                              exclude_characters="|"), min_size=1, max_size=6)
_value = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), max_size=8)


@st.composite
def messages(draw: st.DrawFn, topic: str = "T") -> Message:
    kind = draw(st.sampled_from(["normal", "fifo", "priority", "delayed"]))
    return Message(
        topic, draw(st.binary(max_size=40)),
        tags=draw(st.one_of(st.none(), _word)),
        keys=draw(st.lists(_word, max_size=3)),
        properties=draw(st.dictionaries(st.sampled_from(["a", "b", "ключ"]), _value, max_size=2)),
        message_group=draw(_word) if kind == "fifo" else None,
        priority=draw(st.integers(0, 2**70)) if kind == "priority" else None,
        delay_level=draw(st.integers(1, 18)) if kind == "delayed" else None,
    )


_extras = st.one_of(st.none(), st.dictionaries(st.sampled_from([Prop.UNIQ_KEY, "x", Prop.TAGS]), _value, max_size=2))


def _ids() -> tuple[str, Any]:
    return "ABCD", itertools.count(2**64 - 2).__next__  # wraps past 2**64: the id keeps 16 digits


def _shape(encoded: tuple[list[Any], int]) -> tuple[Any, ...]:
    """What must be equal, property order included (it is the order the store writes them in)."""
    requests, total = encoded
    return total, requests, [list(r.properties.items()) for r in requests]


@native
@settings(max_examples=80, deadline=None)
@given(st.lists(messages(), max_size=6), st.data())
def test_compiled_encoder_equals_its_twin(batch: list[Message], data: st.DataObject) -> None:
    extras = data.draw(st.one_of(st.none(), st.lists(_extras, min_size=len(batch), max_size=len(batch) + 1)))
    limit = data.draw(st.sampled_from([10**6, 30]))
    args = (batch, data.draw(st.integers(0, 7)), data.draw(st.integers(0, 2**62)), extras, limit)
    kw: dict[str, Any] = {"born_host": "10.0.0.1:5", "reconsume_times": data.draw(st.integers(0, 16))}
    compiled = requestcodec.encode_messages_native(*args, **kw, unique_ids=_ids())
    try:
        twin = requestcodec.encode_messages_py(*args, **kw, unique_ids=_ids())
    except (ValidationError, MessageTooLargeError):
        assert compiled is None  # the compiled encoder leaves every refusal to the twin
        return
    # it takes every batch the twin takes (no subclasses or non-lists here)
    assert compiled is not None and _shape(compiled) == _shape(twin)


@native
def test_compiled_encoder_leaves_other_shapes_to_the_twin() -> None:
    class Mine(Message):
        pass

    plain = [Message("T", b"a")]
    assert requestcodec.encode_messages_native(tuple(plain), 0, 1, None, 100) is None  # not a list
    assert requestcodec.encode_messages_native([Mine("T", b"a")], 0, 1, None, 100) is None
    assert requestcodec.encode_messages_native(plain, 0, 1, (None,), 100) is None  # extras not a list
    requests, total = requestcodec.encode_messages([Mine("T", b"ab")], 0, 1, None, 100)
    assert total == 2 and requests[0].body == b"ab"


def test_unique_ids_keep_new_unique_id_format_and_counter() -> None:
    before = new_unique_id()
    requests, _ = requestcodec.encode_messages([Message("T", b"")] * 3, 0, 1, None, 100)
    after = new_unique_id()
    ids = [before, *(r.properties[Prop.UNIQ_KEY] for r in requests), after]
    assert all(re.fullmatch("[0-9A-F]{28}", i) for i in ids)
    assert len({i[:12] for i in ids}) == 1  # one process prefix
    counts = [int(i[12:], 16) for i in ids]
    assert counts == sorted(counts) and len(set(counts)) == 5


@pytest.mark.parametrize(("batch", "extras", "error"), [
    ([], None, "a batch needs at least one message"),
    ([Message("T", b"a")], [None, None], "extra_properties has 2 entries for 1 messages"),
    ([Message("T", b"a"), Message("U", b"b")], None, "batch message 1 has topic 'U'"),
    ([Message("T", b"a"), Message("T", b"b", delay_level=2)], None, "batch message 1 is delayed"),
    ([Message("T", b"a" * 60), Message("T", b"b" * 41)], None, "batch bodies total 101 bytes; the limit is 100"),
])
def test_refused_batches_name_what_is_wrong(batch: list[Message], extras: Any, error: str) -> None:
    with pytest.raises((ValidationError, MessageTooLargeError), match=re.escape(error)):
        requestcodec.encode_messages(batch, 0, 1, extras, 100)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker.open(tmp_path / "b", plugins=["store_mmap"], options={"store_mmap": {"flush": "async"}}) as opened:
        opened.create_topic("T", 2)
        yield opened


def _stored(broker: Broker, queue_id: int, offset: int, count: int) -> list[tuple[Any, ...]]:
    pulled = broker.pull(broker.topic_queues("T")[queue_id], offset, count).messages
    return [(m.topic, m.queue_id, m.body, m.tags_code, m.born_host, m.reconsume_times, m.sys_flag,
             {k: v for k, v in m.properties.items() if k != Prop.UNIQ_KEY}) for m in pulled]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(messages().filter(lambda m: not m.is_delayed and m.priority is None), min_size=1, max_size=5),
       st.data())
def test_put_batch_stores_the_same_either_way(broker: Broker, batch: list[Message], data: st.DataObject) -> None:
    """Both encoders on one broker (each example appends to it: offsets are read, not assumed)."""
    extras = data.draw(st.one_of(st.none(), st.lists(_extras, min_size=len(batch), max_size=len(batch))))
    firsts = []
    for disabled in (False, True):
        requestcodec._native_disabled = disabled
        try:
            results = broker.put_batch(batch, 1, extra_properties=extras)
        finally:
            requestcodec._native_disabled = False
        firsts.append(results[0].queue_offset)
        for result, extra in zip(results, extras or [None] * len(batch), strict=True):
            stored = broker.query_by_id(result.msg_id)
            assert stored is not None and stored.unique_id == result.unique_id
            if extra and Prop.UNIQ_KEY in extra:
                assert result.unique_id == extra[Prop.UNIQ_KEY]
    assert _stored(broker, 1, firsts[0], len(batch)) == _stored(broker, 1, firsts[1], len(batch))


def test_send_results_are_built_when_read(broker: Broker) -> None:
    results = broker.put_batch([Message("T", b"a"), Message("T", b"b")], 0)
    assert isinstance(results, SendResults) and len(results) == 2
    listed = list(results)
    assert all(type(r) is SendResult and r.status is SendStatus.SEND_OK for r in listed)
    assert [r.queue_offset for r in listed] == [0, 1] and listed[1].queue == broker.topic_queues("T")[0]
    assert results == listed and results[-1] == listed[1] and results[:1] == listed[:1]
    assert pickle.loads(pickle.dumps(results)) == listed
    with pytest.raises(AttributeError, match="read-only"):
        results._queue = broker.topic_queues("T")[1]
    assert SendResults([], [], broker.topic_queues("T")[0], SendStatus.SLAVE_NOT_AVAILABLE) == []


def test_append_columns_build_each_result_when_read(broker: Broker) -> None:
    """store_mmap answers put_batch in columns (ColumnAppending); each AppendResult equals the one
    its record's read and query give."""
    results = broker.put_batch([Message("T", b"a"), Message("T", b"bb"), Message("T", b"c")], 1)
    assert isinstance(results, SendResults)
    stored = results._results
    assert isinstance(stored, AppendColumns) and len(stored) == 3
    rows = list(stored)
    assert all(type(r) is AppendResult and r.status is AppendStatus.PUT_OK for r in rows)
    assert [r.queue_offset for r in rows] == [0, 1, 2] and len({r.store_timestamp_ms for r in rows}) == 1
    for row, sent in zip(rows, results, strict=True):
        assert row.msg_id == sent.msg_id
        message = broker.query_by_id(row.msg_id)
        assert message is not None and (message.commit_log_offset, message.size) == (row.commit_log_offset, row.size)
    assert stored[-1] == rows[2] and stored[:2] == rows[:2] and stored == rows
    assert stored.end_offset == rows[2].commit_log_offset + rows[2].size
    assert pickle.loads(pickle.dumps(stored)) == rows
    timed_out = stored.with_status(AppendStatus.FLUSH_DISK_TIMEOUT)
    assert [r.status for r in timed_out] == [AppendStatus.FLUSH_DISK_TIMEOUT] * 3
    with pytest.raises(IndexError):
        stored[3]
    with pytest.raises(AttributeError, match="read-only"):
        stored._ts = 0
    with pytest.raises(ValidationError, match="3 integers per record"):
        AppendColumns([1, 2], "P" * 16, 0)


def _ins(broker: Broker) -> dict[Any, int]:
    snapshot = broker.traffic.snapshot()
    return {**snapshot.messages_in, **{("bytes", *k): v for k, v in snapshot.bytes_in.items()},
            ("latency",): snapshot.append_latency.count}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages().filter(lambda m: not m.is_delayed and m.priority is None), _extras)
def test_put_stores_the_same_on_its_fast_path(broker: Broker, message: Message, extra: Any) -> None:
    """put's compiled plain path, its Python twin and the general path (the compiled encoder
    off) store the same message, answer the same SendResult and count the same traffic."""
    sender, compiled = broker._parts.sender, requestcodec.put_one
    sent, counted = [], []
    for put, plain in ((broker.put, compiled), (broker.put, requestcodec.put_one_py), (sender.put_general, None)):
        requestcodec._native_disabled = plain is None  # the general path without the batch encoder either
        requestcodec.put_one = plain or compiled
        before = _ins(broker)
        try:
            sent.append(put(message, 1, extra_properties=extra))
        finally:
            requestcodec._native_disabled = False
            requestcodec.put_one = compiled
        after = _ins(broker)
        counted.append({k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})
    assert all(type(r) is SendResult and r.status is SendStatus.SEND_OK for r in sent)
    assert [r.queue_offset - sent[0].queue_offset for r in sent] == [0, 1, 2]
    assert {r.queue for r in sent} == {broker.topic_queues("T")[1]}
    stored = [_stored(broker, 1, r.queue_offset, 1) for r in sent]
    assert stored[0] == stored[1] == stored[2]
    assert counted[0] == counted[1] == counted[2]
    for result in sent:
        found = broker.query_by_id(result.msg_id)
        assert found is not None and found.unique_id == result.unique_id and found.queue_offset == result.queue_offset
    if extra and Prop.UNIQ_KEY in extra:
        assert sent[0].unique_id == sent[1].unique_id == sent[2].unique_id == extra[Prop.UNIQ_KEY]


def _took_plan(broker: Broker, topic: str) -> bool:
    return bool(broker._parts.sender._plans.get(topic))


def test_put_plan_follows_the_topic_table(broker: Broker) -> None:
    """A topic grown or deleted after its plan was made: the next put sees the change."""
    assert broker.put(Message("T", b"a"), 1).queue_offset == 0 and _took_plan(broker, "T")
    with pytest.raises(ValidationError, match="queue id 3 is out of range for topic 'T' \\(2 queues\\)"):
        broker.put(Message("T", b"a"), 3)
    broker.create_topic("T", 4)
    assert broker.put(Message("T", b"b"), 3).queue == broker.topic_queues("T")[3] and _took_plan(broker, "T")
    broker.delete_topic("T")
    assert not _took_plan(broker, "T")
    again = broker.put(Message("T", b"c"), 0)  # the general path creates it again (auto_create_topic)
    assert again.queue == broker.topic_queues("T")[0] and broker.put(Message("T", b"d"), 0).queue == again.queue
    assert _took_plan(broker, "T")


def test_put_checks_what_may_change_for_every_topic(tmp_path: Path) -> None:
    """Rate limits, observers, a closed broker: set after a topic's plan was made, each still
    decides the next put (the general path takes over while it applies)."""
    from plugmq.config.limits import RateLimit
    from plugmq.core import ManualClock
    from plugmq.core.errors import ClientError, RateLimitedError, TopicError
    from tests.test_event_hooks import OnStored

    with Broker.open(tmp_path / "b", plugins=["store_mmap"], clock=ManualClock(1_000.0),
                     auto_create_topic=False) as broker:
        broker.create_topic("T", 1)
        broker.put(Message("T", b"a"), 0)
        assert _took_plan(broker, "T")
        with pytest.raises(TopicError, match="topic 'Nope' does not exist"):
            broker.put(Message("Nope", b"a"), 0)
        assert "Nope" not in broker._parts.sender._plans  # names never created are not kept
        broker.rate_limits.set("topics", "T", RateLimit(messages_per_s=1, burst_s=1))
        broker.put(Message("T", b"b"), 0)
        with pytest.raises(RateLimitedError):
            broker.put(Message("T", b"c"), 0)  # the clock stands still: the bucket stays empty
        broker.rate_limits.set("topics", "T", None)
        stored = OnStored("stored-recorder")
        broker.add_observer(stored, "stored-recorder")
        sent = broker.put(Message("T", b"d", tags="x"), 0)
        assert [c["message"].msg_id for c in stored.calls] == [sent.msg_id]
        broker.remove_observer("stored-recorder")
        broker.put(Message("T", b"e"), 0)
        assert len(stored.calls) == 1
        messages_in = broker.traffic.snapshot().messages_in
        assert messages_in == {("T", "normal"): 4}
    with pytest.raises(ClientError, match="is closed"):
        broker.put(Message("T", b"f"), 0)


def test_put_refusals_are_the_general_paths(broker: Broker) -> None:
    with pytest.raises(MessageTooLargeError, match="message body for topic 'T' is"):
        broker.put(Message("T", b"x" * (4 * 1024 * 1024 + 1)), 0)
    with pytest.raises(ValidationError, match="queue id 5 is out of range for topic 'T'"):
        broker.put(Message("T", b"x"), 5)
    with pytest.raises(ValidationError, match="has a priority but the topic is not a priority topic"):
        broker.put(Message("T", b"x", priority=1), 0)


@settings(max_examples=40, deadline=None)
@given(messages(), st.integers(0, 2**32))
def test_message_is_the_same_with_or_without_the_compiled_filler(message: Message, seed: int) -> None:
    """Message (and the trusted constructors) fill their slots in one compiled call or one by one."""
    from plugmq.core import message as core_message

    compiled = requestcodec._native.fill if requestcodec._native is not None else None
    queue = MessageQueue("T", "b", 1)
    for fill in (compiled, None):
        core_message.install_slot_filler(fill)
        try:
            rebuilt = Message(message.topic, message.body, message.tags, message.keys, message.properties,
                              message.delay_level, message.deliver_at_ms, message.message_group, message.priority)
            assert rebuilt == message
            result = SendResult.trusted(SendStatus.SEND_OK, "ID", str(seed), queue, seed)
            assert result == SendResult(SendStatus.SEND_OK, "ID", str(seed), queue, seed)
            request = AppendRequest.trusted("T", 1, b"b", {"k": "v"}, tags_code=seed, born_timestamp_ms=7)
            assert request == AppendRequest("T", 1, b"b", {"k": "v"}, tags_code=seed, born_timestamp_ms=7)
            with pytest.raises(ValidationError, match="message key 'a b' must be a non-empty string without spaces"):
                Message("T", b"", keys=["a b"])
        finally:
            core_message.install_slot_filler(compiled)
