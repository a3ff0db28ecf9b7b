"""delay_level's bulk restore (``restore_all``: due scheduled messages back to their real topic in
one pass) builds exactly what the plain one-message ``restore`` builds - the full constructor
with its validators - message for message, and fails the same way on a bad real topic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, Prop, StoredMessage
from plugmq.core.errors import PlugmqError
from plugmq.plugins.delay_level.rewrite import restore, restore_all, to_schedule

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00\x01\x02"), max_size=12)
_topics = st.one_of(st.sampled_from(["Orders", "a-b_c", "%RETRY%g", "T" * 127]),
                    st.text(st.sampled_from("abcXYZ09_-%|"), min_size=1, max_size=10),
                    _text)  # mostly invalid names
_queues = st.one_of(st.integers(0, 2**31).map(str), st.sampled_from(["", "-1", "x", "²", "٣", " 1", "1.0"]), _text)
_tags = st.one_of(st.none(), st.sampled_from(["T", "a||b", " x || y ", "||", ""]), _text)


@st.composite
def _scheduled(draw: st.DrawFn) -> StoredMessage | None:
    """A message as the schedule topic holds it (or a gap: None), with any mix of the delay
    properties present, missing or malformed."""
    if draw(st.integers(0, 9)) == 0:
        return None
    props = draw(st.dictionaries(_text.filter(bool), _text, max_size=3))
    for name, values in ((Prop.REAL_TOPIC, _topics), (Prop.REAL_QUEUE_ID, _queues), (Prop.TAGS, _tags),
                         (Prop.DELAY_LEVEL, _text), (Prop.DELIVER_AT_MS, _text), (Prop.UNIQ_KEY, _text)):
        value = draw(st.one_of(st.none(), values))
        if value is not None and draw(st.integers(0, 5)):
            props[name] = value
    return StoredMessage(
        topic="SCHEDULE_TOPIC_XXXX", queue_id=draw(st.integers(0, 17)), body=draw(st.binary(max_size=8)),
        properties=props, queue_offset=draw(st.integers(0, 2**40)), commit_log_offset=draw(st.integers(0, 2**40)),
        size=100, tags_code=draw(st.integers(-(2**63), 2**63 - 1)), born_timestamp_ms=draw(st.integers(0, 2**45)),
        store_timestamp_ms=1, born_host=draw(st.sampled_from(["127.0.0.1:1", "[::1]:9", "10.0.0.2:65535"])),
        store_host="127.0.0.1:0", reconsume_times=draw(st.integers(0, 16)), sys_flag=draw(st.integers(0, 2**31 - 1)),
        prepared_transaction_offset=draw(st.integers(0, 2**40)), body_crc=0)


def _one_by_one(messages: list[StoredMessage | None]) -> list[AppendRequest | None] | type[Exception]:
    try:
        return [None if m is None else restore(m) for m in messages]
    except PlugmqError as exc:
        return type(exc)


@settings(max_examples=100, deadline=None)
@given(st.lists(_scheduled(), max_size=12))
def test_restore_all_builds_what_restore_builds(messages: list[StoredMessage | None]) -> None:
    expected = _one_by_one(messages)
    if isinstance(expected, type):
        with pytest.raises(expected):
            restore_all(messages)
        return
    got = restore_all(messages)
    assert got == expected
    for request, reference in zip(got, expected, strict=True):
        if request is not None and reference is not None:
            assert dict(request.properties) == dict(reference.properties)
            assert type(request.properties) is type(reference.properties)  # read-only, as the constructor makes it


def test_a_scheduled_message_comes_back_as_it_was_sent() -> None:
    sent = AppendRequest("Orders", 3, b"x", {Prop.TAGS: "a||b", Prop.KEYS: "k", Prop.UNIQ_KEY: "u1"},
                         tags_code=7, born_timestamp_ms=5, reconsume_times=2, sys_flag=4)
    scheduled = to_schedule(sent, 2, 1_000)
    stored = StoredMessage(scheduled.topic, scheduled.queue_id, scheduled.body, scheduled.properties, 0, 0, 1,
                           scheduled.tags_code, 5, 6, scheduled.born_host, "127.0.0.1:0", 2, 4, 0, 0)
    assert restore_all([stored]) == [restore(stored)]
    [back] = restore_all([stored])
    assert back is not None
    assert (back.topic, back.queue_id, back.body, dict(back.properties)) == ("Orders", 3, b"x", dict(sent.properties))
    assert back.tags_code != 7  # recomputed from TAGS, as RocketMQ does
    assert (back.born_timestamp_ms, back.reconsume_times, back.sys_flag) == (5, 2, 4)
