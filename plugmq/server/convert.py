"""Between the protocol's messages and plugmq's: what a client sends, what a consumer receives."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping

import attrs
from google.protobuf import timestamp_pb2

from plugmq.core.errors import InvalidNameError, ValidationError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE, Message, StoredMessage, SysFlag, slot_filler
from plugmq.core.names import SYSTEM_PROPERTY_KEYS, Prop, validate_topic
from plugmq.server.protocol import (
    Code,
    DigestType,
    Encoding,
    MessageType,
    definition_pb2,
)
from plugmq.server.status import RpcFailure

__all__ = ["Outgoing", "body_digest", "is_plain", "message_type_of", "outgoing", "plain_outgoing", "to_proto", "topic_name"]

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


#: Limits of what one message may carry besides its body (as Apache RocketMQ's proxy checks them).
MAX_USER_PROPERTIES = 128
MAX_USER_PROPERTIES_BYTES = 16 * 1024
MAX_MESSAGE_ID_CHARS = 128
MAX_TAG_CHARS = 1024
MAX_KEYS_BYTES = 8 * 1024


def inflate(body: bytes, limit: int) -> bytes:
    """A compressed body (gzip, or zlib as some clients send under GZIP), inflated to at most
    ``limit`` bytes: a small body that would inflate past it is refused after ``limit + 1`` bytes,
    not inflated whole first."""
    out = bytearray()
    rest = body
    while rest:
        inflater = zlib.decompressobj(wbits=47)  # 32 + 15: a gzip or a zlib header
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise RpcFailure(Code.MESSAGE_CORRUPTED, f"body is marked GZIP but does not decompress: {exc}") from exc
        if len(out) > limit or (inflater.unconsumed_tail and not inflater.eof):
            raise RpcFailure(Code.MESSAGE_BODY_TOO_LARGE, f"the GZIP body inflates to more than {limit:,} bytes, the "
                                                          "broker's max_message_size; send smaller messages")
        if not inflater.eof:
            raise RpcFailure(Code.MESSAGE_CORRUPTED, "body is marked GZIP but its compressed stream is cut short")
        rest = inflater.unused_data  # gzip allows several members one after another
    return bytes(out)


def _body(body: bytes, encoding: int, limit: int) -> bytes:
    if encoding == Encoding.GZIP:
        body = inflate(body, limit)
    if not body:
        raise RpcFailure(Code.MESSAGE_BODY_EMPTY, "message body is empty; RocketMQ messages need a body")
    return body


def _check_sizes(message_id: str, tag: str | None, keys: tuple[str, ...], user: Mapping[str, str] | None) -> None:
    """Oversize ids, tags, keys and properties are the client's error, each with its own code."""
    if len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise RpcFailure(Code.ILLEGAL_MESSAGE_ID, f"message_id is {len(message_id)} characters; the limit is "
                                                  f"{MAX_MESSAGE_ID_CHARS}")
    if tag is not None and len(tag) > MAX_TAG_CHARS:
        raise RpcFailure(Code.ILLEGAL_MESSAGE_TAG, f"tag is {len(tag)} characters; the limit is {MAX_TAG_CHARS}")
    if keys:
        size = sum(len(key.encode()) + 1 for key in keys)
        if size > MAX_KEYS_BYTES:
            raise RpcFailure(Code.ILLEGAL_MESSAGE_KEY, f"keys take {size:,} bytes; the limit is {MAX_KEYS_BYTES:,}")
    if not user:
        return
    if len(user) > MAX_USER_PROPERTIES:
        raise RpcFailure(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"user_properties holds {len(user)} properties; the "
                                                            f"limit is {MAX_USER_PROPERTIES}")
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in user.items())
    if size > MAX_USER_PROPERTIES_BYTES:
        raise RpcFailure(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                         f"user_properties take {size:,} bytes; the limit is {MAX_USER_PROPERTIES_BYTES:,} (move "
                         "large values into the body)")


_BAD_TEXT = frozenset("\x01\x02\n\r")
_KNOWN_TAGS: set[str] = set()  # tags that passed _check_text (and the size check): producers reuse a few
_KNOWN_TAGS_LIMIT = 4096
_SUPPORTED_KINDS = frozenset((MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION,
                              MessageType.PRIORITY))


def _check_text(code: int, what: str, text: str) -> None:
    if not text or text.isspace() or not _BAD_TEXT.isdisjoint(text):
        raise RpcFailure(code, f"{what} {text!r} is blank or holds control characters")


def outgoing(proto: definition_pb2.Message, max_body: int = DEFAULT_MAX_BODY_SIZE) -> Outgoing:
    """Check one sent message into an Outgoing; each problem is its own protocol code.

    ``max_body``: the broker's max_message_size, which a GZIP body may not inflate beyond.

    The checks here are the ones with a protocol code of their own; the Message constructor
    checks the rest (topic name, property text) once. Each field is read once: every read of a
    protobuf field builds a Python object.
    """
    props = proto.system_properties
    message_id = props.message_id
    if not message_id:
        raise RpcFailure(Code.ILLEGAL_MESSAGE_ID, "message_id is empty; the client must give each message an id")
    if (not message_id.isprintable() and not _BAD_TEXT.isdisjoint(message_id)) or message_id.isspace():
        _check_text(Code.ILLEGAL_MESSAGE_ID, "message_id", message_id)  # a printable id holds no _BAD_TEXT
    tag = _tag_of(props)
    keys = _keys_of(props)
    user_properties = proto.user_properties
    user = dict(user_properties) if user_properties else None
    if user or keys or len(message_id) > MAX_MESSAGE_ID_CHARS or (tag is not None and len(tag) > MAX_TAG_CHARS):
        _check_sizes(message_id, tag, keys, user)
        if user:
            _check_reserved(user)
    group = _group_of(props)
    deliver_at = _delivery_ms(props.delivery_timestamp) if props.HasField("delivery_timestamp") else None
    kind = props.message_type or MessageType.NORMAL
    priority = props.priority if props.HasField("priority") else None
    if kind != MessageType.NORMAL or group is not None or deliver_at is not None or priority is not None:
        _check_kind(kind, group, deliver_at, priority)
    body = proto.body
    encoding = props.body_encoding
    if encoding or not body:
        body = _body(body, encoding, max_body)
    try:
        message = Message(proto.topic.name, body, tag, keys, user, None,
                          deliver_at if kind == MessageType.DELAY else None, group,
                          priority if kind == MessageType.PRIORITY else None)
    except InvalidNameError as exc:
        raise RpcFailure(Code.ILLEGAL_TOPIC, str(exc)) from exc
    except ValidationError as exc:
        raise RpcFailure(Code.BAD_REQUEST, str(exc)) from exc
    if tag is not None and len(_KNOWN_TAGS) < _KNOWN_TAGS_LIMIT:
        _KNOWN_TAGS.add(tag)
    return _new_outgoing(message, _extra(message_id, props.trace_context), kind, group, message_id)


def _extra(message_id: str, trace_context: str) -> dict[str, str]:
    """A sent message's system properties: its id, and its trace context, kept with the message
    and handed to its consumers."""
    return {Prop.UNIQ_KEY: message_id, Prop.TRACE_CONTEXT: trace_context} if trace_context else \
        {Prop.UNIQ_KEY: message_id}


_OUTGOING_SLOTS = tuple(Outgoing.__dict__[a.name] for a in attrs.fields(Outgoing))


def _new_outgoing(message: Message, extra: Mapping[str, str], kind: int, group: str | None,
                  message_id: str) -> Outgoing:
    """An Outgoing of values outgoing() checked: its slots filled in one call where the compiled
    slot filler is there (attrs' frozen init sets them one by one)."""
    fill = slot_filler()
    if fill is None:
        return Outgoing(message, extra, kind, group, message_id)
    out: Outgoing = object.__new__(Outgoing)
    fill(_OUTGOING_SLOTS, out, message, extra, kind, group, message_id)
    return out


_MESSAGE_SLOTS = tuple(Message.__dict__[a.name] for a in attrs.fields(Message))
_HAS_FIELD = definition_pb2.SystemProperties.HasField
_PLAIN_TYPES = frozenset((MessageType.MESSAGE_TYPE_UNSPECIFIED, MessageType.NORMAL))  # unset: NORMAL
#: A plain message's proven topic and tag (see :func:`plain_outgoing`).
ProvenKey = tuple[str, str | None]


def is_plain(out: Outgoing) -> bool:
    """Whether ``out`` is a plain message: a normal one with no keys, user properties, message
    group, delivery time or priority (what :func:`plain_outgoing` converts)."""
    message = out.message
    return (out.kind == MessageType.NORMAL and out.message_group is None and not message.keys
            and not message.properties and message.deliver_at_ms is None and message.priority is None)


def plain_outgoing(proto: definition_pb2.Message, proven: Mapping[ProvenKey, Message]) -> Outgoing | None:
    """:func:`outgoing` of a plain message (:func:`is_plain`, its body not GZIP) whose topic and
    tag an earlier message of the call proved good: ``proven`` maps (topic, tag) to that
    message, one :func:`outgoing` built. The Outgoing is the one :func:`outgoing` would build,
    with the checks that depend on the topic and the tag alone not repeated; the message's own
    fields (its id, its body, that no other field is set) are checked here. None: not such a
    message, or not a good one: :func:`outgoing` checks it and says what is wrong."""
    props = proto.system_properties
    message_id = props.message_id
    # A printable id holds none of _BAD_TEXT (no set lookup per character); others: outgoing().
    if not message_id or len(message_id) > MAX_MESSAGE_ID_CHARS or not message_id.isprintable() or \
            message_id.isspace():
        return None
    has = _HAS_FIELD  # the method itself: no attribute lookup on each message
    if (props.message_type not in _PLAIN_TYPES or props.body_encoding == Encoding.GZIP or props.keys
            or proto.user_properties or has(props, "message_group") or has(props, "delivery_timestamp")
            or has(props, "priority")):
        return None
    tag: str | None = props.tag
    if not tag:
        if has(props, "tag"):
            return None  # set but empty: outgoing() refuses it
        tag = None
    known = proven.get((proto.topic.name, tag))
    body = proto.body
    if known is None or not body:
        return None
    extra = _extra(message_id, props.trace_context)
    fill = slot_filler()
    if fill is None:
        return Outgoing(Message(known.topic, body, tag), extra, MessageType.NORMAL, None, message_id)
    message = object.__new__(Message)  # the values Message() checked for ``known``: its slots filled in one call
    fill(_MESSAGE_SLOTS, message, known.topic, body, known.tags, (), known.properties, None, None, None, None)
    out: Outgoing = object.__new__(Outgoing)
    fill(_OUTGOING_SLOTS, out, message, extra, MessageType.NORMAL, None, message_id)
    return out


def _tag_of(props: definition_pb2.SystemProperties) -> str | None:
    """The message's tag (None when unset); a set but empty or malformed tag is refused."""
    tag: str = props.tag
    if tag:
        if tag not in _KNOWN_TAGS:
            _check_text(Code.ILLEGAL_MESSAGE_TAG, "tag", tag)
        return tag
    if props.HasField("tag"):
        _check_text(Code.ILLEGAL_MESSAGE_TAG, "tag", "")  # set, but empty: refused
    return None


def _keys_of(props: definition_pb2.SystemProperties) -> tuple[str, ...]:
    """The message's keys; an empty key or one holding whitespace is refused."""
    if not props.keys:
        return ()
    keys = tuple(props.keys)
    for key in keys:
        if not key or any(c.isspace() for c in key):
            raise RpcFailure(Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is empty or holds whitespace")
    return keys


def _check_reserved(user: Mapping[str, str]) -> None:
    if not SYSTEM_PROPERTY_KEYS.isdisjoint(user):
        key = next(k for k in user if k in SYSTEM_PROPERTY_KEYS)
        raise RpcFailure(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                         f"user property {key!r} is a reserved system property name; rename it")


def _group_of(props: definition_pb2.SystemProperties) -> str | None:
    """The message group (None when unset), checked for text and length."""
    if not props.HasField("message_group"):
        return None
    group: str = props.message_group
    _check_text(Code.ILLEGAL_MESSAGE_GROUP, "message_group", group)
    if len(group) > _MAX_GROUP_LENGTH:
        raise RpcFailure(Code.ILLEGAL_MESSAGE_GROUP,
                         f"message_group is {len(group)} characters; the limit is {_MAX_GROUP_LENGTH}")
    return group


# Seconds beyond this (year 5138) are milliseconds: rocketmq-python-client 5.x documents
# ``Message.delivery_timestamp`` in milliseconds and copies it into the protobuf's seconds field.
_MAX_PLAUSIBLE_SECONDS = 10**11


def _delivery_ms(stamp: timestamp_pb2.Timestamp) -> int:
    """``delivery_timestamp`` in epoch milliseconds; BAD_REQUEST naming the field for one that is
    not a time (above all milliseconds written into its seconds field)."""
    if stamp.seconds > _MAX_PLAUSIBLE_SECONDS:
        raise RpcFailure(Code.BAD_REQUEST,
                         f"delivery_timestamp.seconds is {stamp.seconds}, which is epoch milliseconds, not seconds "
                         f"(year {1970 + stamp.seconds // 31_556_952} otherwise). rocketmq-python-client 5.x copies "
                         "Message.delivery_timestamp into the seconds field: set it in epoch seconds, e.g. "
                         "int(time.time()) + delay_seconds")
    try:
        return int(stamp.ToMilliseconds())
    except ValueError as exc:
        raise RpcFailure(Code.BAD_REQUEST, f"delivery_timestamp (seconds={stamp.seconds}, nanos={stamp.nanos}) is "
                                           f"not a valid time: {exc}") from None


def _check_kind(kind: int, group: str | None, deliver_at: int | None, priority: int | None) -> None:
    if kind not in _SUPPORTED_KINDS:
        name = MessageType.Name(kind) if kind in MessageType.values() else str(kind)
        raise RpcFailure(Code.UNSUPPORTED, f"message type {name} is not supported by plugmq; "
                                           "send NORMAL, FIFO, DELAY, TRANSACTION or PRIORITY messages")
    if kind == MessageType.PRIORITY:
        if priority is None or priority < 0:
            raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a PRIORITY message needs a priority >= 0")
        if group is not None or deliver_at is not None:
            raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                             "a PRIORITY message may not have a message_group or a delivery_timestamp")
        return
    if priority is not None:
        raise RpcFailure(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         f"only a PRIORITY message has a priority; this one is {MessageType.Name(kind)}")
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


def body_digest(body: bytes) -> str:
    """The body digest every official client verifies: MD5 as upper-case hex.

    This is what Apache RocketMQ's proxy sends, and the one digest the clients agree on. Their
    CRC32 checks disagree: Java and Go expect unpadded upper-case hex (``Long.toHexString``),
    Node.js the unsigned decimal number, Python zero-padded hex, so a CRC32 checksum any one
    of them accepts is flagged as corrupted by another.
    """
    return hashlib.md5(body).hexdigest().upper()


_TRANSACTION_COMMIT = int(SysFlag.TRANSACTION_COMMIT)  # a plain int: IntFlag's own & runs in Python


def message_type_of(stored: StoredMessage) -> int:
    return _message_type(stored.properties, stored.sys_flag)


def _message_type(properties: Mapping[str, str], sys_flag: int) -> int:
    if properties.get(Prop.SHARDING_KEY):
        return MessageType.FIFO
    if Prop.PRIORITY in properties:
        return MessageType.PRIORITY
    if int(sys_flag) & _TRANSACTION_COMMIT:
        return MessageType.TRANSACTION
    return MessageType.NORMAL


# A timestamp protobuf holds years 1..9999; stored times within it are set as two integers
# (Timestamp.FromMilliseconds checks the range in Python on every call, and raises outside it).
_MAX_TIMESTAMP_MS = 253_402_300_799_999


def _set_timestamp(stamp: timestamp_pb2.Timestamp, millis: int) -> None:
    if 0 <= millis <= _MAX_TIMESTAMP_MS:
        stamp.seconds = millis // 1000
        stamp.nanos = millis % 1000 * 1_000_000
    else:
        stamp.FromMilliseconds(millis)


def to_proto(stored: StoredMessage, *, namespace: str = "", receipt_handle: str | None = None,
             attempt: int | None = None, invisible_ms: int | None = None,
             into: definition_pb2.Message | None = None) -> definition_pb2.Message:
    """A stored message as the protocol delivers it (message id = the client's id); ``into``: an
    empty message to fill in place (a response's own field: no copy into the response).

    Each property is read from the stored message once (``tags``, ``keys`` and the user
    properties are derived from its properties on every read)."""
    proto = definition_pb2.Message() if into is None else into
    properties = stored.properties
    topic = proto.topic
    topic.name = stored.topic
    if namespace:
        topic.resource_namespace = namespace
    body = stored.body
    proto.body = body
    if not SYSTEM_PROPERTY_KEYS.issuperset(properties):
        proto.user_properties.update(stored.user_properties)
    props = proto.system_properties
    tag = properties.get(Prop.TAGS)
    if tag is not None:
        props.tag = tag
    keys = properties.get(Prop.KEYS)
    if keys:
        props.keys.extend(keys.split())
    props.message_id = properties.get(Prop.UNIQ_KEY) or stored.msg_id
    digest = props.body_digest
    digest.type = DigestType.MD5
    digest.checksum = body_digest(body)
    props.body_encoding = Encoding.IDENTITY
    props.message_type = _message_type(properties, stored.sys_flag)
    _set_timestamp(props.born_timestamp, stored.born_timestamp_ms)
    props.born_host = stored.born_host
    _set_timestamp(props.store_timestamp, stored.store_timestamp_ms)
    props.store_host = stored.store_host
    props.queue_id = stored.queue_id
    props.queue_offset = stored.queue_offset
    group = properties.get(Prop.SHARDING_KEY)
    if group:
        props.message_group = group
    priority = properties.get(Prop.PRIORITY)
    if priority is not None and priority.isdigit():
        props.priority = int(priority)
    trace_context = properties.get(Prop.TRACE_CONTEXT)
    if trace_context:
        props.trace_context = trace_context
    if receipt_handle is not None:
        props.receipt_handle = receipt_handle
    if attempt is not None:
        props.delivery_attempt = attempt
    if invisible_ms is not None:
        props.invisible_duration.FromMilliseconds(invisible_ms)
    return proto
