"""Message's compiled __init__ (plugmq.kit._messageinit.h) against the checked Python one: for any
arguments, the same Message or the same error, and names learnt the same way."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.core import Message
from plugmq.core import message as core_message
from plugmq.kit import requestcodec

pytestmark = pytest.mark.skipif(not requestcodec.native_available(), reason="plugmq.kit._requestcodec was not built")

_FIELDS = ("topic", "body", "tags", "keys", "properties", "delay_level", "deliver_at_ms", "message_group", "priority")
_anything = st.one_of(st.none(), st.integers(-2, 3), st.booleans(), st.text(max_size=3), st.binary(max_size=3),
                      st.tuples(), st.lists(st.text(max_size=2), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                                              st.text(max_size=2),
                                                                                              max_size=1))


def _mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly what senders give (the compiled path's case), one time in eight anything."""
    return st.sampled_from(range(8)).flatmap(lambda pick: rare if pick == 0 else common)


_values = {
    "topic": _mostly(st.sampled_from(["T", "Known"]), st.one_of(st.sampled_from(["bad topic", "", "x" * 128]), _anything)),
    "body": _mostly(st.binary(max_size=8), st.one_of(st.builds(bytearray, st.binary(max_size=4)), _anything)),
    "tags": _mostly(st.sampled_from([None, "A", "A||B"]), st.one_of(st.sampled_from(["", " ", "a\x01"]), _anything)),
    "keys": _mostly(st.sampled_from([(), "", [], None]), st.one_of(st.sampled_from(["k1 k2", ["k"], ["a b"]]), _anything)),
    "properties": _mostly(st.sampled_from([None, {}]), st.one_of(st.sampled_from([{"k": "v"}, {"UNIQ_KEY": "x"}]),
                                                                   _anything)),
    "delay_level": _mostly(st.none(), st.one_of(st.integers(-1, 3), _anything)),
    "deliver_at_ms": _mostly(st.none(), st.one_of(st.integers(-1, 10), _anything)),
    "message_group": _mostly(st.none(), st.one_of(st.sampled_from(["g", " "]), _anything)),
    "priority": _mostly(st.none(), st.one_of(st.integers(-1, 2), _anything)),
}


@st.composite
def calls(draw: st.DrawFn) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments as callers give them: some by position, some by keyword, now and then a wrong one."""
    given_count = draw(st.integers(0, len(_FIELDS)))
    values = [draw(_values[name]) for name in _FIELDS[:given_count]]
    by_position = draw(st.integers(0, given_count))
    kwargs = dict(zip(_FIELDS[by_position:given_count], values[by_position:], strict=True))
    if draw(st.integers(0, 9)) == 0:
        kwargs[draw(st.sampled_from(["topic", "body", "bogus"]))] = draw(_anything)
    return tuple(values[:by_position]), kwargs


@pytest.fixture
def checked_init() -> Iterator[None]:
    """Run a test's body with the checked __init__ installed, then put the compiled one back."""
    core_message.install_message_init(None)
    try:
        yield
    finally:
        core_message.install_message_init(requestcodec._native.message_init)


def _outcome(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    try:
        message = Message(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any error is the outcome compared
        return type(exc), str(exc)
    return tuple((name, getattr(message, name), type(getattr(message, name))) for name in _FIELDS)


@settings(max_examples=400, deadline=None)
@given(calls())
def test_compiled_init_builds_what_the_checked_one_builds(call: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
    args, kwargs = call
    compiled_first = _outcome(args, kwargs)  # may learn a name: the checked one then sees it known too
    compiled_again = _outcome(args, kwargs)
    core_message.install_message_init(None)
    try:
        checked = _outcome(args, kwargs)
    finally:
        core_message.install_message_init(requestcodec._native.message_init)
    assert compiled_first == checked
    assert compiled_again == checked


def test_the_common_case_is_taken_and_the_rest_checked() -> None:
    assert type(Message.__init__).__name__ == "method_descriptor"
    known = Message("KnownTopic", b"x", "KnownTag")  # learnt by the checked __init__
    assert Message("KnownTopic", b"x", "KnownTag") == known
    assert Message(body=b"x", tags="KnownTag", topic="KnownTopic", keys=(), properties={}) == known
    assert Message("KnownTopic", b"x", "KnownTag").properties is Message("KnownTopic", b"y").properties  # shared
    with pytest.raises(TypeError, match="got multiple values for argument 'topic'"):
        Message("KnownTopic", b"x", topic="KnownTopic")  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'body'"):
        Message("KnownTopic")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes from 3 to 10 positional arguments but 11 were given"):
        Message("KnownTopic", b"x", None, (), None, None, None, None, None, None)  # type: ignore[call-arg]
    assert Message("KnownTopic", bytearray(b"x")).body == b"x"  # converted by the checked one


def test_the_signature_reads_as_the_checked_one(checked_init: None) -> None:
    checked = inspect.signature(Message).parameters.values()
    core_message.install_message_init(requestcodec._native.message_init)
    compiled = inspect.signature(Message).parameters.values()
    assert [(p.name, p.kind, p.default) for p in compiled] == [(p.name, p.kind, p.default) for p in checked]
