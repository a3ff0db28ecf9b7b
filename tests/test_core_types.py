from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq import InvalidNameError, Message, MessageQueue, MessageTooLargeError, ValidationError
from plugmq.core import Prop, encode_msg_id, tags_code, validate_topic
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS, parse_delay_levels
from plugmq.core.errors import ConfigError
from plugmq.core.hashing import java_string_hash, split_tags
from plugmq.core.message import check_body_size, decode_msg_id
from plugmq.core.names import validate_group


@pytest.mark.parametrize("name", ["T", "a" * 127, "%RETRY%group", "a|b", "A-b_9"])
def test_legal_names(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_group(name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("", "empty"), ("a" * 128, "128 characters"), ("a b", "' '"), ("../etc", "'.'"), ("t/x", "'/'"),
     ("tópico", "'ó'"), (5, "must be a string")],
)
def test_illegal_names_say_why(name: object, fragment: str) -> None:
    with pytest.raises(InvalidNameError, match=fragment):
        validate_topic(name)


def test_message_validation() -> None:
    message = Message("T", bytearray(b"abc"), tags="A", keys="k1 k2", properties={"p": "1"})
    assert message.body == b"abc" and message.keys == ("k1", "k2")
    assert hash(message) == hash(Message("T", b"abc", tags="A", keys=["k1", "k2"], properties={"p": "2"}))
    with pytest.raises(InvalidNameError):
        Message("bad topic", b"")
    with pytest.raises(ValidationError, match="system property"):
        Message("T", b"", properties={Prop.TAGS: "x"})
    with pytest.raises(ValidationError, match="must be a string"):
        Message("T", b"", properties={"n": 5})  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match="either delay_level or deliver_at_ms"):
        Message("T", b"", delay_level=2, deliver_at_ms=10)
    with pytest.raises(ValidationError, match="delay_level"):
        Message("T", b"", delay_level=0)
    with pytest.raises(ValidationError, match="no tag"):
        Message("T", b"", tags=" || ")
    with pytest.raises(ValidationError, match="reserved"):
        Message("T", b"", properties={"a": "x\x01y"})


def test_body_size_limit() -> None:
    check_body_size(b"x" * 10, 10)
    with pytest.raises(MessageTooLargeError, match="11 bytes; the limit is 10"):
        check_body_size(b"x" * 11, 10, topic="T")


def test_message_queue_orders_like_rocketmq() -> None:
    queues = [MessageQueue("T", "broker-9", 0), MessageQueue("T", "broker-10", 1), MessageQueue("T", "broker-10", 0)]
    assert [(q.broker_name, q.queue_id) for q in sorted(queues)] == [("broker-10", 0), ("broker-10", 1), ("broker-9", 0)]
    assert str(queues[0]) == "MessageQueue [topic=T, brokerName=broker-9, queueId=0]"


def test_java_hash_matches_java() -> None:
    # Values computed by java.lang.String.hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # surrogate pair: two UTF-16 code units


def test_tags_code() -> None:
    assert split_tags(" A || ||B ") == ["A", "B"]
    assert tags_code(None) == 0
    assert tags_code("TagA") == java_string_hash("TagA")
    assert tags_code("A||B") == java_string_hash("A") | java_string_hash("B")


@given(st.integers(min_value=0, max_value=2**63 - 1), st.integers(min_value=0, max_value=65535))
@settings(max_examples=100, deadline=None)
def test_msg_id_round_trip(offset: int, port: int) -> None:
    host = f"10.1.2.3:{port}"
    assert decode_msg_id(encode_msg_id(host, offset)) == (host, offset)


def test_msg_id_rejects_garbage() -> None:
    with pytest.raises(ValidationError, match="hexadecimal"):
        decode_msg_id("zz")
    with pytest.raises(ValidationError, match="32 hex digits"):
        decode_msg_id("00")


def test_delay_levels() -> None:
    assert len(DEFAULT_DELAY_LEVELS_MS) == 18
    assert DEFAULT_DELAY_LEVELS_MS[2] == 10_000 and DEFAULT_DELAY_LEVELS_MS[-1] == 7_200_000
    assert parse_delay_levels("1s 2m 1h 1d") == (1000, 120_000, 3_600_000, 86_400_000)
    with pytest.raises(ConfigError, match="'5x'"):
        parse_delay_levels("1s 5x")


def test_has_capability_answers_as_isinstance_once_per_class() -> None:
    from plugmq.core.contracts import BulkReading, LogPositioned, has_capability

    class Positioned:
        def log_end_offset(self) -> int:
            return 7

    class Plain:
        pass

    for obj in (Positioned(), Plain(), Positioned()):
        for protocol in (LogPositioned, BulkReading):
            assert has_capability(obj, protocol) is isinstance(obj, protocol)
