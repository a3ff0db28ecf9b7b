"""Between the protocol's messages and plugmq's: what a client sends, what a consumer receives."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Mapping

import attrs
from rocketmq.grpc_protocol import (
    Code,
    DigestType,
    Encoding,
    MessageType,
    definition_pb2,
)

from plugmq.core.errors import InvalidNameError, ValidationError
from plugmq.core.message import Message, StoredMessage, SysFlag
from plugmq.core.names import SYSTEM_PROPERTY_KEYS, Prop, validate_topic
from plugmq.server.status import RpcFailure

__all__ = ["Outgoing", "message_type_of", "outgoing", "to_proto", "topic_name"]

_MAX_GROUP_LENGTH = 128


def topic_name(resource: definition_pb2.Resource) -> str:
    """The topic a request names; ILLEGAL_TOPIC (with the rule) if it is not a legal name."""
    try:
        return validate_topic(resource.name)
    except InvalidNameError as exc:
        raise RpcFailure(Code.ILLEGAL_TOPIC, str(exc)) from exc


@attrs.frozen
class Outgoing:
    """A message a producer sent, ready for the broker: the Message plus system properties."""

    message: Message
    extra: Mapping[str, str]
    kind: int
    message_group: str | None
    message_id: str


def _body(proto: definition_pb2.Message) -> bytes:
    body = proto.body
    encoding = proto.system_properties.body_encoding
    if encoding == Encoding.GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise RpcFailure(Code.MESSAGE_CORRUPTED, f"body is marked GZIP but does not decompress: {exc}") from exc
    if not body:
        raise RpcFailure(Code.MESSAGE_BODY_EMPTY, "message body is empty; RocketMQ messages need a body")
    return body


def _check_text(code: int, what: str, text: str) -> None:
    if not text.strip() or any(c in text for c in ("\x01", "\x02", "\n", "\r")):
        raise RpcFailure(code, f"{what} {text!r} is blank or holds control characters")


def outgoing(proto: definition_pb2.Message) -> Outgoing:
    """Validate one sent message into an Outgoing; each problem is its own protocol code."""
    topic = topic_name(proto.topic)
    props = proto.system_properties
    body = _body(proto)
    message_id = props.message_id
    if not message_id:
        raise RpcFailure(Code.ILLEGAL_MESSAGE_ID, "message_id is empty; the client must give each message an id")
    _check_text(Code.ILLEGAL_MESSAGE_ID, "message_id", message_id)
    tag = props.tag if props.HasField("tag") else None
    if tag is not None:
        _check_text(Code.ILLEGAL_MESSAGE_TAG, "tag", tag)
    for key in props.keys:
        if not key or any(c.isspace() for c in key):
            raise RpcFailure(Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is empty or holds whitespace")
    for key in proto.user_properties:
        if key in SYSTEM_PROPERTY_KEYS:
            raise RpcFailure(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                             f"user property {key!r} is a reserved system property name; rename it")
    group = props.message_group if props.HasField("message_group") else None
    if group is not None:
        _check_text(Code.ILLEGAL_MESSAGE_GROUP, "message_group", group)
        if len(group) > _MAX_GROUP_LENGTH:
            raise RpcFailure(Code.ILLEGAL_MESSAGE_GROUP,
                             f"message_group is {len(group)} characters; the limit is {_MAX_GROUP_LENGTH}")
    deliver_at = props.delivery_timestamp.ToMilliseconds() if props.HasField("delivery_timestamp") else None
    kind = props.message_type or MessageType.NORMAL
    _check_kind(kind, group, deliver_at)
    try:
        message = Message(topic, body, tags=tag, keys=tuple(props.keys), properties=dict(proto.user_properties),
                          deliver_at_ms=deliver_at if kind == MessageType.DELAY else None)
    except ValidationError as exc:
        raise RpcFailure(Code.BAD_REQUEST, str(exc)) from exc
    extra = {Prop.UNIQ_KEY: message_id}
    if group is not None:
        extra[Prop.SHARDING_KEY] = group
    return Outgoing(message, extra, kind, group, message_id)


def _check_kind(kind: int, group: str | None, deliver_at: int | None) -> None:
    name = MessageType.Name(kind) if kind in MessageType.values() else str(kind)
    if kind in (MessageType.LITE, MessageType.PRIORITY) or kind not in MessageType.values():
        raise RpcFailure(Code.UNSUPPORTED, f"message type {name} is not supported by plugmq; "
                                           "send NORMAL, FIFO, DELAY or TRANSACTION messages")
    if kind == MessageType.FIFO and group is None:
        raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message needs a message_group")
    if kind == MessageType.DELAY and deliver_at is None:
        raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery_timestamp")
    if kind == MessageType.TRANSACTION and (group is not None or deliver_at is not None):
        raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         "a TRANSACTION message may not have a message_group or a delivery_timestamp")
    if kind == MessageType.NORMAL and (group is not None or deliver_at is not None):
        raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         "a NORMAL message may not have a message_group (FIFO) or a delivery_timestamp (DELAY)")


def message_type_of(stored: StoredMessage) -> int:
    if stored.properties.get(Prop.SHARDING_KEY):
        return MessageType.FIFO
    if stored.sys_flag & SysFlag.TRANSACTION_COMMIT:
        return MessageType.TRANSACTION
    return MessageType.NORMAL


def to_proto(stored: StoredMessage, *, namespace: str = "", receipt_handle: str | None = None,
             attempt: int | None = None, invisible_ms: int | None = None) -> definition_pb2.Message:
    """A stored message as the protocol delivers it (message id = the client's id)."""
    proto = definition_pb2.Message()
    proto.topic.name = stored.topic
    proto.topic.resource_namespace = namespace
    proto.body = stored.body
    proto.user_properties.update(stored.user_properties)
    props = proto.system_properties
    if stored.tags is not None:
        props.tag = stored.tags
    props.keys.extend(stored.keys)
    props.message_id = stored.unique_id or stored.msg_id
    props.body_digest.type = DigestType.CRC32
    props.body_digest.checksum = format(zlib.crc32(stored.body) & 0xFFFFFFFF, "08X")
    props.body_encoding = Encoding.IDENTITY
    props.message_type = message_type_of(stored)
    props.born_timestamp.FromMilliseconds(stored.born_timestamp_ms)
    props.born_host = stored.born_host
    props.store_timestamp.FromMilliseconds(stored.store_timestamp_ms)
    props.store_host = stored.store_host
    props.queue_id = stored.queue_id
    props.queue_offset = stored.queue_offset
    group = stored.properties.get(Prop.SHARDING_KEY)
    if group:
        props.message_group = group
    if receipt_handle is not None:
        props.receipt_handle = receipt_handle
    if attempt is not None:
        props.delivery_attempt = attempt
    if invisible_ms is not None:
        props.invisible_duration.FromMilliseconds(invisible_ms)
    return proto
