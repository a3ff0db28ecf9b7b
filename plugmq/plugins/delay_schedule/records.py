"""Binary record formats: the request payload, message-log records and schedule-log records.

Layouts follow QMQ's (seed 001) with what recovery here needs on top:

message log record (``ML_HEAD``, then the request payload)::

    4 magic | 4 total length | 4 crc32 of everything after this field | 1 attributes
    | 8 store timestamp | 8 own message-log offset | 8 sequence | 8 deliver-at ms | 4 delay level
    | payload

The record carries its own offset so a message id (which encodes that offset) can be checked
by one read: a stale or forged id never decodes as somebody else's record.

schedule log record (``SCH_HEAD``, payload, ``SCH_TAIL``)::

    4 magic | 4 total length | 4 crc32 (up to the trailer) | 8 store timestamp | 8 schedule time
    | 8 sequence | 8 source message-log offset | 4 index within the segment | 4 delay level
    | payload | 4 total length | 4 magic

The trailer lets recovery read a segment's last record without scanning the file: the last
record gives the segment's message count (index + 1) and the newest source offset, which is how
a replay of the message log skips records a segment already holds.

The request payload (version 2, written now) is one fixed header with both lengths, then the
text ``topic\x01born host\x01key\x01value\x01...`` (RocketMQ's separator, banned from names and
property text) and the body, so a burst decodes with one ``unpack``, one ``decode`` and one
``split`` per message. A version 1 payload (length-prefixed fields one by one) starts with its
queue id, whose first byte is never 0xFF: that byte tells the two apart.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection, Sequence
from typing import NamedTuple

from plugmq.core import AppendRequest, ValidationError
from plugmq.kit.requestcodec import RequestLayout, decode_requests
from plugmq.plugins.delay_schedule.layout import MAX_RECORD, SCH_HEAD, SCH_MAGIC, SCH_TAIL

__all__ = [
    "ML_HEAD",
    "ML_MAGIC",
    "SCH_HEAD",
    "SCH_MAGIC",
    "SCH_TAIL",
    "MessageLogRecord",
    "ScheduleRecord",
    "decode_due_requests",
    "decode_message_log_record",
    "decode_request",
    "decode_schedule_record",
    "encode_message_log_record",
    "encode_request",
    "encode_schedule_record",
]

ML_MAGIC = 0x514D4C31  # "QML1"
ATTR_MESSAGE = 0

ML_HEAD = struct.Struct(">IIIBqqqqi")
_CHECK = struct.Struct(">III")  # magic, total length, crc: the head of every record
_REQ_FIXED = struct.Struct(">iqqiiq")
_REQ2_MARK = 0xFF
# mark, version, queue, tags code, born ms, reconsume, sys flag, prepared offset, text and body lengths
_REQ2 = struct.Struct(">BBxxiqqiiqII")
_SEP = "\x01"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def encode_request(request: AppendRequest) -> bytes:
    """Every field of the request, so the write-back is exactly what the producer sent."""
    parts = [request.topic, request.born_host]
    for key, value in request.properties.items():
        parts += (key, value)
    text = _SEP.join(parts)
    if text.count(_SEP) != len(parts) - 1:
        bad = next((k for k, v in request.properties.items() if _SEP in k or _SEP in v), "born_host")
        raise ValidationError(f"{bad!r} contains the RocketMQ separator \\x01, which is reserved; "
                              "remove it from the property name and value")
    raw = text.encode()
    head = _REQ2.pack(
        _REQ2_MARK, 2, request.queue_id, request.tags_code, request.born_timestamp_ms, request.reconsume_times,
        request.sys_flag, request.prepared_transaction_offset, len(raw), len(request.body),
    )
    return b"".join((head, raw, request.body))



def decode_request(buf: bytes, *, drop: Collection[str] = (), start: int = 0) -> AppendRequest:
    """The request ``encode_request`` wrote at ``start`` of ``buf``, without the properties named
    in ``drop``. ValueError when a version 2 payload does not hold its two fields."""
    if buf[start] == _REQ2_MARK:
        (_mark, _version, queue_id, tags_code, born_ts, reconsume, sys_flag, prep, text_len,
         body_len) = _REQ2.unpack_from(buf, start)
        pos = start + _REQ2.size
        parts = buf[pos:pos + text_len].decode().split(_SEP)
        if len(parts) % 2:
            raise ValueError("a delay_schedule request payload has an odd number of text fields")
        props = dict(zip(parts[2::2], parts[3::2]))
        for key in drop:
            props.pop(key, None)
        pos += text_len
        # a CRC-checked record of a request validated when it was scheduled: no second validation
        return AppendRequest.trusted(parts[0], queue_id, buf[pos:pos + body_len], props, tags_code=tags_code,
                                     born_timestamp_ms=born_ts, born_host=parts[1], reconsume_times=reconsume,
                                     sys_flag=sys_flag, prepared_transaction_offset=prep)
    queue_id, tags_code, born_ts, reconsume, sys_flag, prep, topic, host, old, body = _decode_v1(
        memoryview(buf)[start:], drop)
    return AppendRequest(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=old,
        tags_code=tags_code,
        born_timestamp_ms=born_ts,
        born_host=host,
        reconsume_times=reconsume,
        sys_flag=sys_flag,
        prepared_transaction_offset=prep,
    )


def decode_due_request(buf: bytes, pos: int, size: int, drop: Collection[str]) -> AppendRequest | None:
    """The request of the schedule record of ``size`` bytes at ``pos`` of ``buf`` (a run of a
    segment read at once), or None when the record fails its magic / length / trailer / crc
    check: the dispatch path's one pass over a record."""
    if pos + size > len(buf) or size < SCH_HEAD.size + SCH_TAIL.size:
        return None
    magic, length, crc = _CHECK.unpack_from(buf, pos)
    end = pos + size - SCH_TAIL.size
    if magic != SCH_MAGIC or length != size or SCH_TAIL.unpack_from(buf, end) != (size, SCH_MAGIC):
        return None
    if zlib.crc32(memoryview(buf)[pos + 12:end]) != crc:
        return None
    try:
        return decode_request(buf, drop=drop, start=pos + SCH_HEAD.size)
    except (ValueError, struct.error, UnicodeDecodeError):
        return None


# A schedule record with a version 2 payload for the compiled bulk decoder
# (plugmq.kit.requestcodec): SCH_HEAD, then _REQ2 (mark 0xFF first), text, body, SCH_TAIL.
_P = SCH_HEAD.size
_LAYOUT = RequestLayout(
    big_endian=True, magic_at=0, magic=SCH_MAGIC, length_at=4, length_minus=0, crc_at=8, crc_from=12,
    crc_back=SCH_TAIL.size, tail=True, mark_at=_P, mark=_REQ2_MARK, queue_at=_P + 4, tags_at=_P + 8,
    born_at=_P + 16, reconsume_at=_P + 24, sys_flag_at=_P + 28, ptx_at=_P + 32, text_len_at=_P + 40,
    body_len_at=_P + 44, text_at=_P + _REQ2.size,
)


def decode_due_requests(buf: bytes, positions: Sequence[int], sizes: Sequence[int],
                        drop: Sequence[str]) -> list[AppendRequest | None]:
    """:func:`decode_due_request` for many records of one buffer: in one call by the compiled
    decoder where it is built (a record it does not take - an older payload, a failed check -
    goes through ``decode_due_request``, which decides)."""
    bulk = decode_requests(_LAYOUT, buf, positions, sizes, drop)
    if bulk is None:
        return [decode_due_request(buf, pos, size, drop) for pos, size in zip(positions, sizes, strict=True)]
    requests = bulk[0]
    for i, request in enumerate(requests):
        if request is None:
            requests[i] = decode_due_request(buf, positions[i], sizes[i], drop)
    return requests


def _decode_v1(view: memoryview, drop: Collection[str]) -> tuple[int, int, int, int, int, int, str, str,
                                                                   dict[str, str], bytes]:
    queue_id, tags_code, born_ts, reconsume, sys_flag, prep = _REQ_FIXED.unpack_from(view, 0)
    pos = _REQ_FIXED.size

    def text(width: struct.Struct) -> str:
        nonlocal pos
        (n,) = width.unpack_from(view, pos)
        pos += width.size
        value = bytes(view[pos : pos + n]).decode()
        pos += n
        return value

    topic = text(_U16)
    host = text(_U16)
    (count,) = _U32.unpack_from(view, pos)
    pos += 4
    props = {}
    for _ in range(count):
        key = text(_U32)
        value = text(_U32)
        if key not in drop:
            props[key] = value
    (n,) = _U32.unpack_from(view, pos)
    pos += 4
    return queue_id, tags_code, born_ts, reconsume, sys_flag, prep, topic, host, props, bytes(view[pos : pos + n])


class MessageLogRecord(NamedTuple):
    offset: int
    size: int
    seq: int
    deliver_at_ms: int
    delay_level: int
    store_ts_ms: int
    payload: bytes


def encode_message_log_record(
    *, offset: int, seq: int, deliver_at_ms: int, delay_level: int, store_ts_ms: int, payload: bytes
) -> bytes:
    size = ML_HEAD.size + len(payload)
    head = ML_HEAD.pack(ML_MAGIC, size, 0, ATTR_MESSAGE, store_ts_ms, offset, seq, deliver_at_ms, delay_level)
    crc = zlib.crc32(payload, zlib.crc32(head[12:]))
    return head[:8] + _U32.pack(crc) + head[12:] + payload


def decode_message_log_record(buf: bytes | memoryview, pos: int) -> MessageLogRecord | None:
    """The record at ``pos`` of ``buf`` (a segment read from position 0 of ``buf``'s view), or
    None when it is incomplete or fails its magic / length / crc check."""
    if len(buf) - pos < ML_HEAD.size:
        return None
    magic, size, crc, attr, store_ts, offset, seq, deliver_at, level = ML_HEAD.unpack_from(buf, pos)
    if magic != ML_MAGIC or attr != ATTR_MESSAGE or not ML_HEAD.size <= size <= MAX_RECORD:
        return None
    if len(buf) - pos < size:
        return None
    if zlib.crc32(memoryview(buf)[pos + 12 : pos + size]) != crc:
        return None
    payload = bytes(memoryview(buf)[pos + ML_HEAD.size : pos + size])
    return MessageLogRecord(offset, size, seq, deliver_at, level, store_ts, payload)


class ScheduleRecord(NamedTuple):
    position: int  # within its segment
    size: int
    seq: int
    schedule_time_ms: int
    source: int
    number: int  # its index within the segment
    delay_level: int
    store_ts_ms: int
    payload: bytes | None  # None when only the header was asked for


def encode_schedule_record(record: MessageLogRecord, *, index: int, store_ts_ms: int) -> bytes:
    size = SCH_HEAD.size + len(record.payload) + SCH_TAIL.size
    head = SCH_HEAD.pack(
        SCH_MAGIC,
        size,
        0,
        store_ts_ms,
        record.deliver_at_ms,
        record.seq,
        record.offset,
        index,
        record.delay_level,
    )
    crc = zlib.crc32(record.payload, zlib.crc32(head[12:]))
    return head[:8] + _U32.pack(crc) + head[12:] + record.payload + SCH_TAIL.pack(size, SCH_MAGIC)


def decode_schedule_record(
    buf: bytes | memoryview, pos: int, *, with_payload: bool = True, base: int = 0
) -> ScheduleRecord | None:
    """The schedule record at ``pos`` of ``buf`` (``base`` = segment position of ``buf[0]``), or
    None when incomplete or corrupt."""
    if len(buf) - pos < SCH_HEAD.size:
        return None
    magic, size, crc, store_ts, when, seq, source, index, level = SCH_HEAD.unpack_from(buf, pos)
    if magic != SCH_MAGIC or not SCH_HEAD.size + SCH_TAIL.size <= size <= MAX_RECORD:
        return None
    if len(buf) - pos < size:
        return None
    view = memoryview(buf)
    tail_size, tail_magic = SCH_TAIL.unpack_from(buf, pos + size - SCH_TAIL.size)
    if tail_size != size or tail_magic != SCH_MAGIC:
        return None
    if zlib.crc32(view[pos + 12 : pos + size - SCH_TAIL.size]) != crc:
        return None
    payload = bytes(view[pos + SCH_HEAD.size : pos + size - SCH_TAIL.size]) if with_payload else None
    return ScheduleRecord(base + pos, size, seq, when, source, index, level, store_ts, payload)
