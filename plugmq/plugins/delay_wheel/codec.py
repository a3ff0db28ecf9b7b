"""Byte layouts of the delay log, the delay index, the per-hour heads and the message id.

Delay log record: ``magic u32 | payload length u32 | crc32(payload) u32 | payload`` where the
payload is the full AppendRequest plus its deliver time (so a write-back rebuilds the request
field for field): fixed fields, then ``[topic, born_host, properties]`` as UTF-8 JSON, then the body.

Delay index entry (seed 000's ``{offset, size, localIndex, globalIndex, preGlobalIndex}``),
32 bytes: ``offset u64 | size u32 | localIndex u32 | globalIndex u32 | preGlobalIndex i32 |
second u16 | reserved u16 | crc32 u32``. ``second`` (0..3599 within the hour) is redundant with
the head chain but lets a crashed hour rebuild its heads from the index alone.

Head of a second, 16 bytes: ``last globalIndex + 1 u32 | entries in the second u32 | reserved``
(0 = empty second), 3600 of them after a 64-byte header ``magic | version | hour | count |
log_end | crc``.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import NamedTuple

import attrs

from plugmq.core import (
    AppendRequest,
    CorruptRecordError,
    Prop,
    decode_msg_id,
    encode_msg_id,
)

__all__ = [
    "HEADER_SIZE",
    "HEAD_FILE_SIZE",
    "HEAD_SIZE",
    "INDEX_ENTRY_SIZE",
    "NO_ENTRY",
    "RECORD_HEADER_SIZE",
    "SECONDS_PER_HOUR",
    "HourHeader",
    "IndexEntry",
    "StoredDelay",
    "WheelMsgIds",
    "decode_index_entry",
    "decode_record",
    "encode_index_entry",
    "encode_record",
]

SECONDS_PER_HOUR = 3600
NO_ENTRY = -1

RECORD_MAGIC = 0xD31A_7E01
_RECORD_HEADER = struct.Struct("<III")
RECORD_HEADER_SIZE = _RECORD_HEADER.size
# deliver_at, scheduled_at, level, queue, tags_code, born, reconsume, sys_flag, ptx, text length
_FIXED = struct.Struct("<qqiiqqiiqI")

_INDEX = struct.Struct("<QIIIiHHI")
INDEX_ENTRY_SIZE = _INDEX.size  # 32
_INDEX_BODY = struct.Struct("<QIIIiHH")

HEAD = struct.Struct("<IIQ")
HEAD_SIZE = HEAD.size  # 16

HEADER_MAGIC = 0xD31A_4EAD
_HEADER = struct.Struct("<IIqQQ")
HEADER_SIZE = 64
HEAD_FILE_SIZE = HEADER_SIZE + SECONDS_PER_HOUR * HEAD_SIZE


_DELAY_PROPS = frozenset({Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS})


@attrs.frozen
class StoredDelay:
    """A delay-log record decoded: the request as it is written back (delay properties cleared;
    the log keeps them) and when it is due."""

    request: AppendRequest
    deliver_at_ms: int
    scheduled_at_ms: int
    delay_level: int | None


def encode_record(request: AppendRequest, deliver_at_ms: int, scheduled_at_ms: int, delay_level: int | None) -> bytes:
    # Text fields as one JSON array: any string survives, and the C decoder keeps dispatch cheap.
    text = json.dumps([request.topic, request.born_host, dict(request.properties)],
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    payload = b"".join((
        _FIXED.pack(
            deliver_at_ms, scheduled_at_ms, -1 if delay_level is None else delay_level, request.queue_id,
            request.tags_code, request.born_timestamp_ms, request.reconsume_times, request.sys_flag,
            request.prepared_transaction_offset, len(text),
        ),
        text,
        request.body,
    ))
    return _RECORD_HEADER.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_record(raw: bytes | memoryview) -> StoredDelay:
    """Decode one whole record (header included); CorruptRecordError if it fails its checks."""
    if len(raw) < RECORD_HEADER_SIZE:
        raise CorruptRecordError(f"delay log record of {len(raw)} bytes is shorter than its header")
    magic, length, crc = _RECORD_HEADER.unpack_from(raw, 0)
    payload = bytes(raw[RECORD_HEADER_SIZE:RECORD_HEADER_SIZE + length])
    if magic != RECORD_MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        raise CorruptRecordError("delay log record failed its magic/length/CRC check")
    (deliver_at, scheduled_at, level, queue_id, tags_code, born, reconsume, sys_flag, ptx,
     text_len) = _FIXED.unpack_from(payload, 0)
    start = _FIXED.size
    topic, born_host, props = json.loads(payload[start:start + text_len].decode("utf-8"))
    for key in _DELAY_PROPS.intersection(props):  # a record is read only to be written back: cleared
        del props[key]
    request = AppendRequest(
        topic=topic, queue_id=queue_id, body=payload[start + text_len:], properties=props,
        tags_code=tags_code, born_timestamp_ms=born, born_host=born_host, reconsume_times=reconsume,
        sys_flag=sys_flag, prepared_transaction_offset=ptx,
    )
    return StoredDelay(request, deliver_at, scheduled_at, None if level < 0 else level)


class IndexEntry(NamedTuple):
    offset: int
    size: int
    local_index: int
    global_index: int
    pre_global_index: int
    second: int


def encode_index_entry(entry: IndexEntry) -> bytes:
    body = _INDEX_BODY.pack(entry.offset, entry.size, entry.local_index, entry.global_index,
                            entry.pre_global_index, entry.second, 0)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_index_entry(raw: bytes | memoryview) -> IndexEntry | None:
    """The entry, or None when the bytes are not a valid entry (zeros, torn or stale)."""
    offset, size, local, gi, pre, second, _res, crc = _INDEX.unpack_from(raw, 0)
    if crc != zlib.crc32(bytes(raw[:_INDEX_BODY.size])) or size == 0 or second >= SECONDS_PER_HOUR:
        return None
    return IndexEntry(offset, size, local, gi, pre, second)


@attrs.frozen
class HourHeader:
    """What the head file remembers besides the 3600 heads: entries reflected in the heads and
    where the delay log ends (the index is the source of truth; this is where recovery starts)."""

    hour: int
    count: int
    log_end: int

    def encode(self) -> bytes:
        body = _HEADER.pack(HEADER_MAGIC, 1, self.hour, self.count, self.log_end)
        return (body + struct.pack("<I", zlib.crc32(body))).ljust(HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, raw: bytes) -> HourHeader | None:
        if len(raw) < _HEADER.size + 4:
            return None
        magic, _version, hour, count, log_end = _HEADER.unpack_from(raw, 0)
        (crc,) = struct.unpack_from("<I", raw, _HEADER.size)
        if magic != HEADER_MAGIC or crc != zlib.crc32(raw[:_HEADER.size]):
            return None
        return cls(hour, count, log_end)


class WheelMsgIds:
    """The id ``schedule`` returns and ``cancel`` takes: RocketMQ's offset-id shape (store host +
    8 bytes) with the 8 bytes = ``hour * 2**32 + globalIndex`` (hour = epoch seconds // 3600 of
    the deliver second), which finds the message's index entry in one read."""

    def __init__(self, store_host: str) -> None:
        self._prefix = encode_msg_id(store_host, 0)[:16]  # parsed once, not per message

    def encode(self, hour: int, global_index: int) -> str:
        return f"{self._prefix}{(hour << 32) | global_index:016X}"

    def decode(self, msg_id: str) -> tuple[int, int] | None:
        """(hour, globalIndex), or None for another broker's id. ValidationError if malformed."""
        _host, value = decode_msg_id(msg_id)
        if msg_id[:16].upper() != self._prefix or value < 0:
            return None
        return value >> 32, value & 0xFFFF_FFFF
