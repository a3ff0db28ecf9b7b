"""Bulk coding of AppendRequests: the put path's encoder and the delay write-back's decoder.

The put path turns a batch of Messages into store requests with :func:`encode_messages`: one call
of the compiled ``_requestcodec`` reads the messages' slots and builds every request (properties,
unique id, tag code), or :func:`encode_messages_py`, its Python twin, which also raises the error
that names what is wrong with a batch the compiled encoder does not take.

A delay plugin keeps each delayed message as a record of its own format whose fixed header holds
an AppendRequest's numbers and whose text is ``topic\\x01born host\\x01key\\x01value...`` (UTF-8)
followed by the body. :class:`RequestLayout` says where those fields are; :func:`decode_requests`
decodes many records of one read buffer in one call with the compiled ``_requestcodec``
(``plugmq/kit/_requestcodec.c``) and returns None when that module was not built, so the plugin
decodes record by record in Python (its own decoder is the reference and the fallback). A record
the compiled decoder does not accept - a failed check, or an older format - comes back as None
and is left to the plugin's Python decoder too, which decides.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.appendcolumns import AppendColumns
from plugmq.core.errors import MessageTooLargeError, ValidationError
from plugmq.core.hashing import tags_code
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    install_message_init,
    install_slot_filler,
    unique_id_state,
)
from plugmq.core.names import Prop
from plugmq.kit.native import Kernel, c_header, layout_version, load_kernel

__all__ = ["HEADER_PATH", "LAYOUT_VERSION", "REQUESTCODEC", "PutPlan", "RequestLayout", "append_direct", "batch_bytes",
           "decode_requests", "encode_messages", "encode_messages_native", "encode_messages_py", "header_text",
           "native_available", "put_batch", "put_batch_py", "put_one", "put_one_py", "put_plan", "request_properties"]

# AppendRequest's slot descriptors in field order: the compiled decoder fills a new request
# through them, as AppendRequest.trusted does.
_SETTERS = tuple(AppendRequest.__dict__[a.name] for a in attrs.fields(AppendRequest))
_native_disabled = False


@attrs.frozen
class RequestLayout:
    """Where a record format keeps what the compiled decoder reads; offsets from the record's start.

    ``length_at`` holds ``size - length_minus``; the CRC-32 at ``crc_at`` covers
    ``[crc_from, size - crc_back)``; ``tail``: the last 8 bytes repeat (size, magic); ``mark_at``
    (-1: none): a byte that must equal ``mark``. queue id, reconsume times and sys flag are
    int32, tags code, born timestamp and prepared offset int64, lengths uint32; ``body_len_at`` -1:
    the body runs from the end of the text to ``size - crc_back``. ``extras``: (offset, width 4 or
    8) of signed integers returned beside each request."""

    big_endian: bool
    magic_at: int
    magic: int
    length_at: int
    length_minus: int
    crc_at: int
    crc_from: int
    crc_back: int
    tail: bool
    mark_at: int
    mark: int
    queue_at: int
    tags_at: int
    born_at: int
    reconsume_at: int
    sys_flag_at: int
    ptx_at: int
    text_len_at: int
    body_len_at: int
    text_at: int
    extras: tuple[tuple[int, int], ...] = ()

    def packed(self) -> tuple[Any, ...]:
        """The layout as the compiled decoder takes it: the integers in field order, then extras."""
        values = attrs.astuple(self, recurse=False)
        return (*(int(v) for v in values[:-1]), tuple((int(at), int(width)) for at, width in self.extras))


_PACKED: dict[RequestLayout, tuple[Any, ...]] = {}

#: What the compiled decoder is built for: the shape of a packed RequestLayout and of AppendRequest
#: (``_requestcodec_layout.h`` is generated from these by ``python scripts/kernel_headers.py``).
CONSTANTS: dict[str, int] = {
    "FORMAT_VERSION": 2,  # 2: encode() as well
    "LAYOUT_ITEMS": len(attrs.fields(RequestLayout)),  # the integers, then the extras tuple
    "REQUEST_FIELDS": len(_SETTERS),
    "MAX_EXTRAS": 8,
    "MAX_DROP": 8,
    "PUT_PLAN_ITEMS": 17,  # put_plan's tuple
}
LAYOUT_VERSION = layout_version(CONSTANTS)
HEADER_PATH = Path(__file__).with_name("_requestcodec_layout.h")
REQUESTCODEC = Kernel(
    module="plugmq.kit._requestcodec",
    layout_version=LAYOUT_VERSION,
    users=("delay_wheel", "delay_schedule", "the broker's put path"),
    fallback=("due messages are decoded record by record by the delay plugin's Python decoder; sends are "
              "encoded by the Python twin"),
    cost="decoding a due message takes about 4x the CPU, encoding a sent one about 3x",
    functions=("encode", "fill", "put_one", "append_direct", "put_batch", "message_init"),
)
_native: Any = load_kernel(REQUESTCODEC)  # the extension module, or None
if _native is not None:
    install_slot_filler(_native.fill)  # Message's fields in one call, not nine
    install_message_init(_native.message_init)  # and the common Message built without a Python frame


def header_text() -> str:
    return c_header("PLUGMQ_KIT_REQUESTCODEC_LAYOUT_H", "plugmq/kit/requestcodec.py", CONSTANTS)


def _packed(layout: RequestLayout) -> tuple[Any, ...]:
    packed = _PACKED.get(layout)
    if packed is None:
        packed = _PACKED[layout] = layout.packed()
    return packed


def native_available() -> bool:
    """Whether the compiled decoder is there (and not turned off by a test)."""
    return _native is not None and not _native_disabled


def decode_requests(layout: RequestLayout, buffer: bytes | memoryview, positions: Sequence[int],
                    sizes: Sequence[int], drop: Sequence[str] = ()) -> tuple[list[AppendRequest | None], list[int]] | None:
    """The requests of the records at ``positions`` (``sizes`` bytes each) of ``buffer``, without
    the properties in ``drop``, and ``len(layout.extras)`` integers per record; None when the
    compiled decoder is not available. A None request: decode that record in Python."""
    if _native is None or _native_disabled:
        return None
    requests, extras = _native.decode(buffer, positions, sizes, _packed(layout), tuple(drop), AppendRequest, _SETTERS)
    return requests, extras


# What the compiled encoder reads and writes: Message's and AppendRequest's slot descriptors in
# field order, the system property names a send adds, and the tag-code function.
_ENCODE_CONTEXT = (
    Message, tuple(Message.__dict__[a.name] for a in attrs.fields(Message)), AppendRequest, _SETTERS,
    (Prop.TAGS, Prop.KEYS, Prop.SHARDING_KEY, Prop.PRIORITY, Prop.UNIQ_KEY), tags_code,
)
_ID_MASK = 0xFFFF_FFFF_FFFF_FFFF


def request_properties(message: Message, extra: Mapping[str, str] | None,
                       unique_id: Callable[[], str] | None = None) -> dict[str, str]:
    """A new dict of the message's properties plus the system ones a send adds (TAGS, KEYS, the
    message group and priority, a unique id - ``unique_id()`` - unless ``extra`` brings the client's)."""
    props = dict(message.properties) if message.properties else {}
    tags = message.tags
    if tags is not None:
        props[Prop.TAGS] = tags
    if message.keys:
        props[Prop.KEYS] = " ".join(message.keys)
    if message.message_group is not None:
        props[Prop.SHARDING_KEY] = message.message_group
    if message.priority is not None:
        props[Prop.PRIORITY] = str(message.priority)
    if extra:
        props.update(extra)
    if Prop.UNIQ_KEY not in props:
        if unique_id is None:
            prefix, counter = unique_id_state()
            props[Prop.UNIQ_KEY] = f"{prefix}{counter() & _ID_MASK:016X}"
        else:
            props[Prop.UNIQ_KEY] = unique_id()
    return props


def batch_bytes(messages: Sequence[Message], extra_properties: Sequence[Mapping[str, str] | None] | None,
                max_message_size: int) -> int:
    """The body bytes of a batch, once it is checked: one topic, nothing delayed, within the limit."""
    if not messages:
        raise ValidationError("a batch needs at least one message")
    if extra_properties is not None and len(extra_properties) != len(messages):
        raise ValidationError(f"extra_properties has {len(extra_properties)} entries for {len(messages)} messages")
    topic = messages[0].topic
    total = 0
    for i, message in enumerate(messages):
        if message.topic != topic:
            raise ValidationError(f"batch message {i} has topic {message.topic!r}; "
                                  f"every message of a batch must have topic {topic!r}")
        if message.is_delayed:
            raise ValidationError(f"batch message {i} is delayed; delayed messages cannot be batched")
        total += len(message.body)
    if total > max_message_size:
        raise MessageTooLargeError(f"batch bodies total {total} bytes; the limit is {max_message_size} "
                                   "(send the batch in smaller parts)")
    return total


def encode_messages_py(messages: Sequence[Message], queue_id: int, born_ms: int,
                       extras: Sequence[Mapping[str, str] | None] | None, max_size: int, *,
                       born_host: str = "127.0.0.1:0", reconsume_times: int = 0,
                       unique_ids: tuple[str, Callable[[], int]] | None = None) -> tuple[list[AppendRequest], int]:
    """The store requests of a batch of one topic for ``queue_id`` and the bodies' length (the
    twin of the compiled encoder); ValidationError or MessageTooLargeError naming what is wrong.
    ``unique_ids``: (prefix, counter) of the unique ids, :func:`unique_id_state`'s by default."""
    total = batch_bytes(messages, extras, max_size)
    prefix, counter = unique_ids or unique_id_state()

    def unique_id() -> str:
        return f"{prefix}{counter() & _ID_MASK:016X}"

    trusted = AppendRequest.trusted
    requests = [trusted(m.topic, queue_id, m.body, request_properties(m, x, unique_id), tags_code=tags_code(m.tags),
                        born_timestamp_ms=born_ms, born_host=born_host, reconsume_times=reconsume_times)
                for m, x in zip(messages, extras or [None] * len(messages), strict=True)]
    return requests, total


def encode_messages_native(messages: Sequence[Message], queue_id: int, born_ms: int,
                           extras: Sequence[Mapping[str, str] | None] | None, max_size: int, *,
                           born_host: str = "127.0.0.1:0", reconsume_times: int = 0,
                           unique_ids: tuple[str, Callable[[], int]] | None = None,
                           ) -> tuple[list[AppendRequest], int] | None:
    """What :func:`encode_messages_py` answers, from the compiled encoder; None when it is not
    available or does not take this batch (a failed check, not a list, not plain Messages)."""
    if _native is None or _native_disabled:
        return None
    prefix, counter = unique_ids or unique_id_state()
    encoded: tuple[list[AppendRequest], int] | None = _native.encode(
        messages, queue_id, born_ms, extras, max_size, born_host, reconsume_times, prefix, counter, _ENCODE_CONTEXT)
    return encoded


def encode_messages(messages: Sequence[Message], queue_id: int, born_ms: int,
                    extras: Sequence[Mapping[str, str] | None] | None, max_size: int) -> tuple[list[AppendRequest], int]:
    """The store requests of a checked batch and its bodies' length: compiled where it can be."""
    encoded = encode_messages_native(messages, queue_id, born_ms, extras, max_size)
    return encoded if encoded is not None else encode_messages_py(messages, queue_id, born_ms, extras, max_size)


# ------------------------------------------------------------------------------ the plain single put
#: What :func:`put_one` needs of a topic, built once per topic (plugmq.broker.sending keeps it until
#: the topic changes): the encoder's context, the size limit, the born host, the store's append,
#: the topic's queues, AppendResult's status / msg_id / queue_offset slots, SendResult and its
#: slots, PUT_OK, SEND_OK, FLUSH_DISK_TIMEOUT, the traffic counters (plugmq.broker.traffic's
#: SharedSends), the arrivals' wake-up, where unique ids come from (``unique_id_state``), the
#: clock's ``now_ms`` (None: the wall clock, which the kernel reads itself), the store's direct
#: append (a capsule of plugmq.core.contracts.DirectAppending, or None) and who the wake-up wakes
#: (lists that are all empty while it has nothing to do, or None: always call it).
PutPlan = tuple[Any, ...]
_RESULT_GETTERS = tuple(AppendResult.__dict__[name] for name in ("status", "msg_id", "queue_offset"))
_SEND_RESULT_SLOTS = tuple(SendResult.__dict__[a.name] for a in attrs.fields(SendResult))


def put_plan(max_size: int, born_host: str, append: Callable[[AppendRequest], AppendResult],
             queues: Sequence[MessageQueue], counters: tuple[Any, ...], wake: Callable[[], None],
             unique_ids: Callable[[], tuple[str, Callable[[], int]]] = unique_id_state,
             now_ms: Callable[[], int] | None = None, direct: object | None = None,
             watchers: tuple[list[Any], ...] | None = None) -> PutPlan:
    """The plan :func:`put_one` stores a topic's plain messages with (all its messages are of the
    topic of ``queues``). ``direct``: the store's direct append, which the compiled put_one calls
    instead of ``append`` where it takes the call (the twin always calls ``append``). ``watchers``:
    lists (changed in place only) that are all empty while ``wake`` has nothing to do: then a put
    does not call it (plugmq.broker.events.Arrivals.watchers)."""
    return (_ENCODE_CONTEXT, max_size, born_host, append, tuple(queues), _RESULT_GETTERS, SendResult,
            _SEND_RESULT_SLOTS, AppendStatus.PUT_OK, SendStatus.SEND_OK, SendStatus.FLUSH_DISK_TIMEOUT, counters, wake,
            unique_ids, now_ms, direct, watchers)


def append_direct(capsule: object, request: AppendRequest) -> AppendResult | None:
    """``request`` stored by a store's direct append (DirectAppending), as the compiled put_one
    calls it, answered as the store's ``append`` answers; None when the store declined (nothing
    done) or the compiled codec is not built. For tests and the storage conformance suite."""
    if _native is None:
        return None
    fields = tuple(getattr(request, a.name) for a in attrs.fields(AppendRequest))
    fields = (*fields[:3], dict(request.properties), *fields[4:])
    stored = _native.append_direct(capsule, fields)
    if stored is None:
        return None
    queue_offset, commit_log_offset, size, store_ts, msg_id = stored
    return AppendResult(AppendStatus.PUT_OK, msg_id, queue_offset, commit_log_offset, size, store_ts)


def _count_sent(counters: tuple[Any, ...], fifo: bool, body_bytes: int, seconds: float) -> None:
    entry, latency, edges = counters[1 if fifo else 0], counters[2], counters[3]
    entry[0] += 1
    entry[1] += body_bytes
    latency[bisect.bisect_left(edges, seconds)] += 1
    latency[-1] += seconds


def _born(born_ms: int | None, now_ms: Callable[[], int] | None) -> int:
    if born_ms is not None:
        return born_ms
    return time.time_ns() // 1_000_000 if now_ms is None else now_ms()


def put_one_py(message: Message, queue_id: int, born_ms: int | None, extra: Mapping[str, str] | None,
               plan: PutPlan) -> SendResult | None:
    """Store one plain message as ``plan`` says (the twin of the compiled ``put_one``): its request,
    the store's append, the SendResult, the traffic counted and the arrivals woken. None, nothing
    done, when it is not a plain message of a valid queue (the caller's general path decides).
    ``born_ms`` None: now, by the plan's clock."""
    (_context, max_size, born_host, append, queues, _getters, _cls, _slots, put_ok, send_ok, flush_timeout,
     counters, wake, unique_ids, now_ms, _direct, watchers) = plan
    if type(message) is not Message or type(queue_id) is not int or not 0 <= queue_id < len(queues):
        return None
    if (type(message.topic) is not str or type(message.body) is not bytes or message.is_delayed
            or message.priority is not None or len(message.body) > max_size):
        return None
    if extra is not None and type(extra) is not dict:
        return None

    uniq_prefix, uniq_next = unique_ids()

    def unique_id() -> str:
        return f"{uniq_prefix}{uniq_next() & _ID_MASK:016X}"

    code = tags_code(message.tags)
    properties = request_properties(message, extra, unique_id)
    request = AppendRequest.trusted(message.topic, queue_id, message.body, properties, tags_code=code,
                                    born_timestamp_ms=_born(born_ms, now_ms),
                                    born_host=born_host)
    started = time.perf_counter()
    stored = append(request)
    _count_sent(counters, Prop.SHARDING_KEY in properties, len(message.body), time.perf_counter() - started)
    status = send_ok if stored.status is put_ok else flush_timeout
    sent = SendResult.trusted(status, stored.msg_id, properties[Prop.UNIQ_KEY], queues[queue_id], stored.queue_offset)
    if watchers is None or any(watchers):
        wake()
    return sent


#: put_one_py's answer in one compiled call where the kernel is built (tests may swap in the twin).
put_one: Callable[[Message, int, int | None, Mapping[str, str] | None, PutPlan], SendResult | None] = (
    put_one_py if _native is None else _native.put_one)


# ------------------------------------------------------------------------------ the plain batch put
#: ``admit(count, total_body_bytes)``: the caller's checks between encoding and storing (raising stops it).
Admit = Callable[[int, int], None]
BatchAppend = Callable[[Sequence[AppendRequest]], AppendColumns]  # a ColumnAppending store's append_columns
BatchPut = tuple[AppendColumns, list[str], int]


def _columns(rows: bytes, id_prefix: str, store_ts: int) -> AppendColumns:
    return AppendColumns(memoryview(rows).cast("q"), id_prefix, store_ts)


def put_batch_py(messages: Sequence[Message], queue_id: int, born_ms: int,
                 extras: Sequence[Mapping[str, str] | None] | None, max_size: int, direct: object | None,
                 append_columns: BatchAppend, admit: Admit, *,
                 unique_ids: tuple[str, Callable[[], int]] | None = None) -> BatchPut | None:
    """Store a plain batch of one topic (the twin of the compiled ``put_batch``): its requests as
    :func:`encode_messages_py` builds them, ``admit(count, total)``, then ``append_columns``; the
    results, each message's unique id and the bodies' length. None, nothing done, when a message
    has a priority or the compiled encoder would not take the batch (the caller's general path
    decides and raises); the twin never calls ``direct``."""
    if (not isinstance(messages, list) or not messages or (extras is not None and not isinstance(extras, list))
            or any(type(m) is not Message or m.priority is not None for m in messages)):
        return None
    if extras is not None and any(x is not None and not isinstance(x, dict) for x in extras):
        return None
    if any(type(m.topic) is not str or type(m.body) is not bytes for m in messages):
        return None
    try:
        requests, total = encode_messages_py(messages, queue_id, born_ms, extras, max_size, unique_ids=unique_ids)
    except ValidationError:  # MessageTooLargeError too: the general path raises it again
        return None
    admit(len(requests), total)
    return append_columns(requests), [r.properties[Prop.UNIQ_KEY] for r in requests], total


def put_batch(messages: Sequence[Message], queue_id: int, born_ms: int,
              extras: Sequence[Mapping[str, str] | None] | None, max_size: int, direct: object | None,
              append_columns: BatchAppend, admit: Admit, *,
              unique_ids: tuple[str, Callable[[], int]] | None = None) -> BatchPut | None:
    """:func:`put_batch_py`'s answer from the compiled kernel, which stores through ``direct``
    (a store's DirectAppending capsule) where it takes the batch; None when the kernel is not
    built (the caller's general path stores)."""
    if _native is None or _native_disabled:
        return None
    prefix, counter = unique_ids or unique_id_state()
    stored: BatchPut | None = _native.put_batch(messages, queue_id, born_ms, extras, max_size, "127.0.0.1:0", prefix,
                                                counter, _ENCODE_CONTEXT, direct, append_columns, admit, _columns)
    return stored
