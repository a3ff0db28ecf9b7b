"""Value types that cross the API: messages, queues, store records, send and pull results.

All are frozen attrs classes, validated when built, so bad input fails before anything is written.
"""

from __future__ import annotations

import abc
import enum
import ipaddress
import itertools
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar, overload

import attrs

from plugmq.core.errors import MessageTooLargeError, ValidationError
from plugmq.core.hashing import split_tags
from plugmq.core.names import SYSTEM_PROPERTY_KEYS, Prop, validate_topic

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "AppendRequest",
    "AppendResult",
    "AppendStatus",
    "BuiltWhenRead",
    "ConsumeQueueEntry",
    "Message",
    "MessageQueue",
    "PullResult",
    "PullStatus",
    "SendResult",
    "SendResults",
    "SendStatus",
    "StoredMessage",
    "SysFlag",
    "check_body_size",
    "decode_msg_id",
    "encode_msg_id",
    "fill_slots_py",
    "install_message_init",
    "install_slot_filler",
    "message_group_queue",
    "new_unique_id",
    "slot_filler",
    "unique_id_state",
]

DEFAULT_MAX_BODY_SIZE = 4 * 1024 * 1024
_Item = TypeVar("_Item")
_FORBIDDEN_IN_PROPS = ("\x01", "\x02")  # separators of the serialized property string


def _frozen_props(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


def _keys(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    return tuple(value)


def _check_text(where: str, text: str) -> None:
    for bad in _FORBIDDEN_IN_PROPS:
        if bad in text:
            raise ValidationError(f"{where} contains the control character {bad!r}, which is reserved")


_KNOWN_TOPICS: set[str] = set()  # names that passed validate_topic: senders reuse a few topics
_KNOWN_TOPICS_LIMIT = 4096


def _check_topic(_inst: object, _attr: object, topic: str) -> None:
    if type(topic) is str and topic in _KNOWN_TOPICS:
        return
    validate_topic(topic)
    if type(topic) is str and len(_KNOWN_TOPICS) < _KNOWN_TOPICS_LIMIT:
        _KNOWN_TOPICS.add(topic)


def _validate_properties(_inst: object, _attr: object, props: Mapping[str, str]) -> None:
    for key, value in props.items():
        if not isinstance(key, str) or not key:
            raise ValidationError(f"property names must be non-empty strings, got {key!r}")
        if not isinstance(value, str):
            raise ValidationError(
                f"property {key!r} must be a string (RocketMQ properties are text), got {type(value).__name__}"
            )
        if key in SYSTEM_PROPERTY_KEYS:
            field = _FIELD_OF_PROPERTY.get(key)
            fix = (f"set Message({field}=...) instead" if field is not None
                   else "the broker sets it; pick another property name")
            raise ValidationError(f"property {key!r} is a system property; {fix}")
        _check_text(f"property {key!r}", key + value)


# The Message field that sets each system property a producer may give (the rest are the broker's).
_FIELD_OF_PROPERTY = {
    Prop.TAGS: "tags",
    Prop.KEYS: "keys",
    Prop.DELAY_LEVEL: "delay_level",
    Prop.DELIVER_AT_MS: "deliver_at_ms",
    Prop.SHARDING_KEY: "message_group",
    Prop.PRIORITY: "priority",
}
MAX_MESSAGE_GROUP_LENGTH = 128


def _validate_message_group(_inst: object, _attr: object, group: str | None) -> None:
    if group is None:
        return
    if not isinstance(group, str) or not group.strip():
        raise ValidationError(f"message_group must be a non-blank string (or None), got {group!r}")
    if len(group) > MAX_MESSAGE_GROUP_LENGTH:
        raise ValidationError(f"message_group is {len(group)} characters; the limit is {MAX_MESSAGE_GROUP_LENGTH}")
    _check_text("message_group", group)


def _validate_priority(_inst: object, _attr: object, priority: int | None) -> None:
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool) or priority < 0):
        raise ValidationError(f"priority must be an int >= 0 (higher is delivered first), got {priority!r}")


def _validate_tags(_inst: object, _attr: object, tags: str | None) -> None:
    if tags is None:
        return
    if not isinstance(tags, str):
        raise ValidationError(f"tags must be a string or None, got {type(tags).__name__}")
    if not split_tags(tags):
        raise ValidationError(f"tags {tags!r} hold no tag; use None for an untagged message")
    _check_text("tags", tags)


def _validate_keys(_inst: object, _attr: object, keys: tuple[str, ...]) -> None:
    for key in keys:
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise ValidationError(f"message key {key!r} must be a non-empty string without spaces")
        _check_text("keys", key)


def _to_bytes(body: bytes | bytearray | memoryview) -> bytes:
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    return body


_KNOWN_TAGS: set[str] = set()  # tag strings that passed _validate_tags: senders reuse a few
_EMPTY_PROPS: Mapping[str, str] = MappingProxyType({})  # shared: nobody can write to it
_BODY_CHECK = attrs.validators.instance_of(bytes)


@attrs.frozen(init=False)
class Message:
    """What a producer sends.

    ``tags`` is one tag (RocketMQ) or several joined by ``||`` (seed 000's multi-tag variant).
    ``keys`` are business keys (a space-separated string or an iterable) indexed for queries.
    A delay is either ``delay_level`` (1-based, RocketMQ's level list) or ``deliver_at_ms``.
    ``message_group`` makes it a FIFO message: one group's messages go to one queue and a FIFO
    consumer group gets them in order. ``priority`` (RocketMQ's RIP-80, an int >= 0) makes it a
    priority message: under a backlog, higher priorities are delivered first. As in RocketMQ 5, a
    message is one kind: a message group, a delay and a priority exclude each other.

    Every field is checked once, here; a message is built on every send, so the common case (a
    known topic and tag, no keys or properties, no delay, group or priority) costs a few type checks.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    delay_level: int | None = None
    deliver_at_ms: int | None = None
    message_group: str | None = None
    priority: int | None = None

    def __init__(self, topic: str, body: bytes | bytearray | memoryview, tags: str | None = None,
                 keys: str | Iterable[str] | None = (), properties: Mapping[str, str] | None = None,
                 delay_level: int | None = None, deliver_at_ms: int | None = None,
                 message_group: str | None = None, priority: int | None = None) -> None:
        if type(topic) is not str or topic not in _KNOWN_TOPICS:
            _check_topic(self, None, topic)
        if type(body) is not bytes:
            body = _to_bytes(body)
            _BODY_CHECK(self, _MESSAGE_FIELDS.body, body)
        if tags is not None and (type(tags) is not str or tags not in _KNOWN_TAGS):
            _validate_tags(self, None, tags)
            if len(_KNOWN_TAGS) < _KNOWN_TOPICS_LIMIT:
                _KNOWN_TAGS.add(tags)
        if keys:
            keys = _keys(keys)
            _validate_keys(self, None, keys)
        else:
            keys = ()
        if properties:
            properties = _frozen_props(properties)
            _validate_properties(self, None, properties)
        else:
            properties = _EMPTY_PROPS
        if delay_level is not None or deliver_at_ms is not None:
            _check_delay(delay_level, deliver_at_ms)
        if message_group is not None or priority is not None:
            _check_kind(message_group, priority, delay_level if deliver_at_ms is None else deliver_at_ms)
        fill = _fill
        if fill is not None:
            fill(_MESSAGE_SLOTS, self, topic, body, tags, keys, properties, delay_level, deliver_at_ms,
                 message_group, priority)
            return
        set_topic, set_body, set_tags, set_keys, set_props, set_level, set_at, set_group, set_priority = (
            _MESSAGE_SETTERS)
        set_topic(self, topic)
        set_body(self, body)
        set_tags(self, tags)
        set_keys(self, keys)
        set_props(self, properties)
        set_level(self, delay_level)
        set_at(self, deliver_at_ms)
        set_group(self, message_group)
        set_priority(self, priority)

    @property
    def is_delayed(self) -> bool:
        return self.delay_level is not None or self.deliver_at_ms is not None


def _check_delay(level: int | None, when: int | None) -> None:
    if level is not None and (not isinstance(level, int) or isinstance(level, bool) or level < 1):
        raise ValidationError(f"delay_level must be an int >= 1, got {level!r}")
    if when is None:
        return
    if not isinstance(when, int) or isinstance(when, bool) or when < 0:
        raise ValidationError(f"deliver_at_ms must be a non-negative int (epoch ms), got {when!r}")
    if level is not None:
        raise ValidationError("give either delay_level or deliver_at_ms, not both")


def _check_kind(group: str | None, priority: int | None, delay: int | None) -> None:
    """Check a message group and a priority, and that a message is one kind (FIFO, priority or delayed)."""
    _validate_message_group(None, None, group)
    _validate_priority(None, None, priority)
    kinds = [name for name, value in (("message_group", group), ("priority", priority), ("a delay", delay))
             if value is not None]
    if len(kinds) > 1:
        raise ValidationError(f"a message is FIFO (message_group), priority or delayed, one of them; this one "
                              f"sets {' and '.join(kinds)}")


_MESSAGE_FIELDS = attrs.fields(Message)
# The slots' own setters, in field order: a frozen class refuses plain attribute assignment.
_MESSAGE_SETTERS = tuple(getattr(Message, a.name).__set__ for a in _MESSAGE_FIELDS)
_MESSAGE_SLOTS = tuple(Message.__dict__[a.name] for a in _MESSAGE_FIELDS)


def fill_slots_py(slots: tuple[Any, ...], obj: object, *values: object) -> None:
    """Set each slot descriptor of ``slots`` on ``obj`` to the value in the same place: the
    Python twin of the compiled ``fill`` (plugmq.kit._requestcodec), which does it in one call."""
    if len(values) != len(slots):
        raise TypeError(f"fill: {len(values)} values for {len(slots)} slots")
    for i, slot in enumerate(slots):
        if not hasattr(type(slot), "__set__"):
            raise TypeError(f"fill: slot {i} is not a data descriptor")
        slot.__set__(obj, values[i])


# The compiled slot filler, when plugmq.kit.requestcodec installed it (the SPI imports no other
# part of plugmq, and a Message built before that uses the slots' setters one by one).
_fill: Callable[..., None] | None = None


def install_slot_filler(fill: Callable[..., None] | None) -> None:
    """Fill Message's (and the trusted constructors') slots with ``fill`` (None: one by one)."""
    global _fill
    _fill = fill


# Message's __init__ as written above: the checked one, which every call not taken by a compiled
# __init__ (install_message_init) still goes to.
_CHECKED_INIT = Message.__init__


def install_message_init(make: Callable[..., Any] | None) -> None:
    """Build Messages with the compiled ``__init__`` that ``make`` returns (None: the checked one).

    ``make(Message, slots, known_topics, known_tags, empty_props, checked_init)`` returns a method
    descriptor that fills the slots itself in the common case (a topic and tags already validated,
    a bytes body, nothing else set) and passes every other call to ``checked_init`` unchanged, so
    both build the same Message and raise the same errors (plugmq.kit._messageinit.h)."""
    init = _CHECKED_INIT if make is None else make(Message, _MESSAGE_SLOTS, _KNOWN_TOPICS, _KNOWN_TAGS, _EMPTY_PROPS,
                                                   _CHECKED_INIT)
    type.__setattr__(Message, "__init__", init)


def slot_filler() -> Callable[..., None] | None:
    """The compiled slot filler installed (``fill(slots, obj, *values)``), None without one: for
    other frozen classes' trusted constructors."""
    return _fill


def message_group_queue(message_group: str, queue_count: int) -> int:
    """The queue of a FIFO message group among ``queue_count`` queues: one group, one queue (the
    same choice for in-process producers and plugmq serve's clients)."""
    return zlib.crc32(message_group.encode()) % queue_count


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker. Orders by (topic, broker_name, queue_id) like RocketMQ."""

    topic: str
    broker_name: str
    queue_id: int = attrs.field(validator=attrs.validators.ge(0))

    def __str__(self) -> str:
        # RocketMQ's MessageQueue.toString, also the consistent-hash key.
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


class SysFlag(enum.IntFlag):
    """RocketMQ's MessageSysFlag bits."""

    NONE = 0
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC


class _TagsAndKeys:
    """``tags`` and ``keys``, read from the properties of a request or a stored message."""

    __slots__ = ()
    properties: Mapping[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.properties.get(Prop.KEYS, "").split())


#: One request's fields for :meth:`AppendRequest.trusted_many`, in field order.
TrustedRequestRow = tuple[str, int, bytes, dict[str, str], int, int, str, int, int, int]


@attrs.frozen
class AppendRequest(_TagsAndKeys):
    """What the broker hands the store: a message placed on one queue, with all its properties.

    ``properties`` holds user and system properties (TAGS, KEYS, UNIQ_KEY, REAL_TOPIC, ...).
    ``tags_code`` is the value for the consume queue's tag field (a tag hash, or a delay
    strategy's deliver time).
    """

    topic: str = attrs.field(validator=_check_topic)
    queue_id: int = attrs.field(validator=attrs.validators.ge(0))
    body: bytes = attrs.field(converter=_to_bytes, validator=attrs.validators.instance_of(bytes))
    properties: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_props, hash=False)
    tags_code: int = 0
    born_timestamp_ms: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    sys_flag: int = 0
    prepared_transaction_offset: int = 0

    @classmethod
    def trusted(cls, topic: str, queue_id: int, body: bytes, properties: dict[str, str], *, tags_code: int = 0,
                born_timestamp_ms: int = 0, born_host: str = "127.0.0.1:0", reconsume_times: int = 0,
                sys_flag: int = 0, prepared_transaction_offset: int = 0) -> AppendRequest:
        """A request built from parts a boundary validated already - the broker makes one from a
        validated Message for every send - so the validators and converters do not run twice.
        ``properties`` must be a dict nobody else holds: it is wrapped read-only, not copied.
        The store still checks everything it writes (names, ranges, property text)."""
        request: AppendRequest = _new_object(cls)
        fill = _fill
        if fill is not None:
            fill(_REQUEST_SLOTS, request, topic, queue_id, body, MappingProxyType(properties), tags_code,
                 born_timestamp_ms, born_host, reconsume_times, sys_flag, prepared_transaction_offset)
            return request
        set_topic, set_queue, set_body, set_props, set_code, set_born_ts, set_born_host, set_reconsume, set_flag, \
            set_prepared = _REQUEST_SETTERS
        set_topic(request, topic)
        set_queue(request, queue_id)
        set_body(request, body)
        set_props(request, MappingProxyType(properties))
        set_code(request, tags_code)
        set_born_ts(request, born_timestamp_ms)
        set_born_host(request, born_host)
        set_reconsume(request, reconsume_times)
        set_flag(request, sys_flag)
        set_prepared(request, prepared_transaction_offset)
        return request

    @classmethod
    def trusted_many(cls, rows: Iterable[TrustedRequestRow]) -> list[AppendRequest]:
        """:meth:`trusted` of each row (the ten fields in field order, ``properties`` a dict nobody
        else holds), in one call: a bulk rewrite - a delay burst writing back hundreds of thousands
        of messages - pays no keyword call per message."""
        fill = _fill if _fill is not None else fill_slots_py
        new, proxy, slots = _new_object, MappingProxyType, _REQUEST_SLOTS
        out: list[AppendRequest] = []
        append = out.append
        for topic, queue_id, body, properties, code, born_ts, born_host, reconsume, flag, prepared in rows:
            request = new(cls)
            fill(slots, request, topic, queue_id, body, proxy(properties), code, born_ts, born_host, reconsume, flag,
                 prepared)
            append(request)
        return out


_new_object = object.__new__
# The slots' own setters (what the frozen class's __init__ ends up calling), in field order.
_REQUEST_SETTERS = tuple(getattr(AppendRequest, a.name).__set__ for a in attrs.fields(AppendRequest))
_REQUEST_SLOTS = tuple(AppendRequest.__dict__[a.name] for a in attrs.fields(AppendRequest))


class AppendStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


@attrs.frozen
class AppendResult:
    """Where a stored message landed."""

    status: AppendStatus
    msg_id: str
    queue_offset: int
    commit_log_offset: int
    size: int
    store_timestamp_ms: int

    @classmethod
    def trusted(cls, status: AppendStatus, msg_id: str, queue_offset: int, commit_log_offset: int, size: int,
                store_timestamp_ms: int) -> AppendResult:
        """A result a store builds from what it wrote: the slots filled without attrs' frozen init."""
        result: AppendResult = _new_object(cls)
        fill = _fill
        if fill is not None:
            fill(_APPEND_RESULT_SLOTS, result, status, msg_id, queue_offset, commit_log_offset, size,
                 store_timestamp_ms)
            return result
        for setter, value in zip(_APPEND_RESULT_SETTERS,
                                 (status, msg_id, queue_offset, commit_log_offset, size, store_timestamp_ms)):
            setter(result, value)
        return result


_APPEND_RESULT_SETTERS = tuple(getattr(AppendResult, a.name).__set__ for a in attrs.fields(AppendResult))
_APPEND_RESULT_SLOTS = tuple(AppendResult.__dict__[a.name] for a in attrs.fields(AppendResult))


@attrs.frozen
class StoredMessage(_TagsAndKeys):
    """A message as stored (RocketMQ's MessageExt): the request plus where and when it landed."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = attrs.field(converter=_frozen_props, hash=False)
    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int = 0
    sys_flag: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @classmethod
    def trusted(cls, topic: str, queue_id: int, body: bytes, properties: dict[str, str], queue_offset: int,
                commit_log_offset: int, size: int, tags_code: int, born_timestamp_ms: int, store_timestamp_ms: int,
                born_host: str, store_host: str, reconsume_times: int, sys_flag: int,
                prepared_transaction_offset: int, body_crc: int) -> StoredMessage:
        """A message a store decoded from a record it checked: built without the converter's
        copy; ``properties`` - a dict nobody else holds - is wrapped read-only as it is."""
        message: StoredMessage = _new_object(cls)
        fill = _fill
        if fill is not None:
            fill(_STORED_SLOTS, message, topic, queue_id, body, MappingProxyType(properties), queue_offset,
                 commit_log_offset, size, tags_code, born_timestamp_ms, store_timestamp_ms, born_host, store_host,
                 reconsume_times, sys_flag, prepared_transaction_offset, body_crc)
            return message
        for setter, value in zip(_STORED_SETTERS, (
                topic, queue_id, body, MappingProxyType(properties), queue_offset, commit_log_offset, size,
                tags_code, born_timestamp_ms, store_timestamp_ms, born_host, store_host, reconsume_times, sys_flag,
                prepared_transaction_offset, body_crc)):
            setter(message, value)
        return message

    @classmethod
    def from_append(cls, request: AppendRequest, result: AppendResult) -> StoredMessage:
        """The message a store holds after it appended ``request`` with ``result``, built
        without reading it back (the store host comes from the offset message id; ValidationError
        when the id is not one)."""
        prefix = result.msg_id[:16]
        store_host = _STORE_HOSTS.get(prefix)
        if store_host is None:
            store_host = decode_msg_id(result.msg_id)[0]
            if len(_STORE_HOSTS) >= 64:
                _STORE_HOSTS.clear()
            _STORE_HOSTS[prefix] = store_host
        return cls.trusted(
            request.topic, request.queue_id, request.body, dict(request.properties), result.queue_offset,
            result.commit_log_offset, result.size, request.tags_code, request.born_timestamp_ms,
            result.store_timestamp_ms, request.born_host, store_host, request.reconsume_times, request.sys_flag,
            request.prepared_transaction_offset, zlib.crc32(request.body),
        )

    @property
    def msg_id(self) -> str:
        return encode_msg_id(self.store_host, self.commit_log_offset)

    @property
    def unique_id(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTY_KEYS}

    def tag_list(self) -> list[str]:
        return split_tags(self.tags)


_STORE_HOSTS: dict[str, str] = {}  # message id prefix (store IPv4 + port, hex) -> "ip:port"
_STORED_SETTERS = tuple(getattr(StoredMessage, a.name).__set__ for a in attrs.fields(StoredMessage))
_STORED_SLOTS = tuple(StoredMessage.__dict__[a.name] for a in attrs.fields(StoredMessage))


@attrs.frozen
class ConsumeQueueEntry:
    """One 20-byte consume-queue entry, with its queue offset."""

    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@attrs.frozen
class SendResult:
    """What ``send`` returns. ``msg_id`` finds the message in one read; ``unique_id`` is the client id."""

    status: SendStatus
    msg_id: str
    unique_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None

    @classmethod
    def trusted(cls, status: SendStatus, msg_id: str, unique_id: str, queue: MessageQueue, queue_offset: int,
                transaction_id: str | None = None) -> SendResult:
        """A result the broker builds from what its store answered: no validators to run."""
        result: SendResult = _new_object(cls)
        fill = _fill
        if fill is not None:
            fill(_SEND_RESULT_SLOTS, result, status, msg_id, unique_id, queue, queue_offset, transaction_id)
            return result
        set_status, set_id, set_unique, set_queue, set_offset, set_txn = _SEND_RESULT_SETTERS
        set_status(result, status)
        set_id(result, msg_id)
        set_unique(result, unique_id)
        set_queue(result, queue)
        set_offset(result, queue_offset)
        set_txn(result, transaction_id)
        return result


_SEND_RESULT_SETTERS = tuple(getattr(SendResult, a.name).__set__ for a in attrs.fields(SendResult))
_SEND_RESULT_SLOTS = tuple(SendResult.__dict__[a.name] for a in attrs.fields(SendResult))


class BuiltWhenRead(Sequence[_Item]):
    """A read-only sequence whose items are built when read (``_result(index)``, ``__len__``).

    Equal to any sequence of the same items; pickles as a list.
    """

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only; cannot set {name!r}")

    @abc.abstractmethod
    def _result(self, index: int) -> _Item:
        """Item ``index`` (negative: from the end), built now."""

    @overload
    def __getitem__(self, index: int) -> _Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[_Item]: ...

    def __getitem__(self, index: int | slice) -> _Item | list[_Item]:
        if isinstance(index, slice):
            return [self._result(i) for i in range(len(self))[index]]
        return self._result(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable as they are

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


class SendResults(BuiltWhenRead[SendResult]):
    """The results of a batch stored on one queue, each SendResult built when it is read.

    A batch of 100 sends builds no result nobody reads. ``replica``: the slave's verdict on all
    of them (SEND_OK: each result's status is its flush's). Equal to any sequence of the same
    results; pickles as a list. Read-only.
    """

    __slots__ = ("_queue", "_replica", "_requests", "_results", "_unique_ids")
    _queue: MessageQueue
    _replica: SendStatus
    _requests: Sequence[AppendRequest]
    _results: Sequence[AppendResult]
    _unique_ids: Sequence[str] | None

    def __init__(self, results: Sequence[AppendResult], requests: Sequence[AppendRequest], queue: MessageQueue,
                 replica: SendStatus = SendStatus.SEND_OK, *, unique_ids: Sequence[str] | None = None) -> None:
        paired, what = (requests, "requests") if unique_ids is None else (unique_ids, "unique ids")
        if len(results) != len(paired):
            raise ValidationError(f"{len(results)} results for {len(paired)} {what}")
        for name, value in (("_results", results), ("_requests", requests), ("_queue", queue), ("_replica", replica),
                            ("_unique_ids", unique_ids)):
            object.__setattr__(self, name, value)

    @classmethod
    def of_unique_ids(cls, results: Sequence[AppendResult], unique_ids: Sequence[str], queue: MessageQueue,
                      replica: SendStatus = SendStatus.SEND_OK) -> SendResults:
        """The results of a batch stored without AppendRequests (the broker's compiled batch put):
        each message's unique id given instead of its request."""
        return cls(results, (), queue, replica, unique_ids=unique_ids)

    def __len__(self) -> int:
        return len(self._results)

    def queue_offsets(self) -> list[int]:
        """Each result's queue offset, in order, no SendResult built (what a server answers with)."""
        from plugmq.core.appendcolumns import AppendColumns  # it imports this module

        results = self._results
        if type(results) is AppendColumns:
            return results.queue_offsets()
        return [result.queue_offset for result in results]

    def shared_status(self) -> SendStatus | None:
        """The status every result has when they all share one (always so for a store's columns),
        else None (also for no result): then read each result's own."""
        from plugmq.core.appendcolumns import AppendColumns  # it imports this module

        results = self._results
        if not len(results):
            return None
        if self._replica is not SendStatus.SEND_OK:
            return self._replica
        stored = {results.status} if type(results) is AppendColumns else {result.status for result in results}
        if len(stored) != 1:
            return None
        return SendStatus.SEND_OK if stored.pop() is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT

    def _result(self, index: int) -> SendResult:
        stored = self._results[index]
        status = self._replica
        if status is SendStatus.SEND_OK and stored.status is not AppendStatus.PUT_OK:
            status = SendStatus.FLUSH_DISK_TIMEOUT
        ids = self._unique_ids
        unique = ids[index] if ids is not None else self._requests[index].properties[Prop.UNIQ_KEY]
        return SendResult.trusted(status, stored.msg_id, unique, self._queue, stored.queue_offset)


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@attrs.frozen
class PullResult:
    status: PullStatus
    messages: tuple[StoredMessage, ...]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def check_body_size(body: bytes, limit: int = DEFAULT_MAX_BODY_SIZE, *, topic: str = "") -> None:
    """Raise MessageTooLargeError if ``body`` is longer than ``limit`` bytes."""
    if len(body) > limit:
        where = f" for topic {topic!r}" if topic else ""
        raise MessageTooLargeError(
            f"message body{where} is {len(body)} bytes; the limit is {limit} "
            f"(raise broker.max_message_size or split the payload)"
        )


def _host_bytes(host: str) -> tuple[bytes, int]:
    address, _, port = host.rpartition(":")
    try:
        return ipaddress.IPv4Address(address).packed, int(port)
    except ValueError as exc:
        raise ValidationError(f"store host {host!r} must be IPv4:port") from exc


def encode_msg_id(store_host: str, commit_log_offset: int) -> str:
    """RocketMQ's offset message id: store IPv4 (4 bytes) + port (4) + commit-log offset (8), hex."""
    ip, port = _host_bytes(store_host)
    return (ip + struct.pack(">iq", port, commit_log_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`encode_msg_id`: (store host, commit-log offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValidationError(f"message id {msg_id!r} is not hexadecimal") from exc
    if len(raw) != 16:
        raise ValidationError(f"message id {msg_id!r} must be 32 hex digits (16 bytes), got {len(raw)} bytes")
    port, offset = struct.unpack(">iq", raw[4:])
    return f"{ipaddress.IPv4Address(raw[:4])}:{port}", offset


def _unique_id_source() -> tuple[str, Callable[[], int]]:
    # 4 random bytes + the pid: another process (or this one after a restart) has another prefix;
    # the count starts at this second << 32, so ids also grow across restarts of the same pid.
    prefix = os.urandom(4).hex().upper() + f"{os.getpid() & 0xFFFF:04X}"
    return prefix, itertools.count((int(time.time()) & 0xFFFF_FFFF) << 32).__next__


_uniq_prefix, _uniq_next = _unique_id_source()


def _reseed_unique_ids() -> None:
    global _uniq_prefix, _uniq_next
    _uniq_prefix, _uniq_next = _unique_id_source()


os.register_at_fork(after_in_child=_reseed_unique_ids)  # a forked child must not repeat the parent's ids


def new_unique_id() -> str:
    """A client-side unique message id: 28 hex digits (random prefix + pid, then a 64-bit count
    started at the process's start second). ``next()`` on the counter is atomic, so no lock."""
    return f"{_uniq_prefix}{_uniq_next() & 0xFFFF_FFFF_FFFF_FFFF:016X}"


def unique_id_state() -> tuple[str, Callable[[], int]]:
    """The prefix and counter :func:`new_unique_id` uses now (a forked child gets its own), for
    encoders that make the same ids in bulk: ``prefix + f"{counter() & (2**64 - 1):016X}"``."""
    return _uniq_prefix, _uniq_next
