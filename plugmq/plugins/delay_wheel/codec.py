"""Byte layouts of the delay log, the delay index, the per-hour heads and the message id.

Delay log record: ``magic u32 | payload length u32 | crc32(payload) u32 | payload`` where the
payload is the full AppendRequest plus its deliver time (so a write-back rebuilds the request
field for field). Version 2 (written now): fixed fields with the length of the text, then the text
and the body. The text is ``topic\x01born host\x01key\x01value\x01key\x01value...`` as UTF-8
(RocketMQ's separators are banned from names and property text), so a burst decodes with one
``decode`` and one ``split`` per record instead of a JSON parse. Version 1 records (text fields
as a JSON array) are still read.

Delay index entry (seed 000's ``{offset, size, localIndex, globalIndex, preGlobalIndex}``),
32 bytes: ``offset u64 | size u32 | localIndex u32 | globalIndex u32 | preGlobalIndex i32 |
second u16 | ms u16 | crc32 u32``. ``second`` (0..3599 within the hour) is redundant with the
head chain but lets a crashed hour rebuild its heads from the index alone; ``ms`` (0..999) is the
millisecond within the second the entry is due, the wheel's millisecond level. Entries written
before the millisecond level have 0 there and were filed under the second their deliver time
rounds *up* to, so 0 is never early for them.

Head of a second, 16 bytes: ``last globalIndex + 1 u32 | entries in the second u32 | reserved``
(0 = empty second), 3600 of them after a 64-byte header ``magic | version | hour | count |
log_end | crc``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import attrs

from plugmq.core import AppendRequest, CorruptRecordError, Prop, ValidationError, encode_msg_id
from plugmq.core.message import decode_msg_id
from plugmq.kit.requestcodec import RequestLayout, decode_requests

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
    "decode_record_at",
    "decode_records_at",
    "encode_index_entry",
    "encode_record",
    "encode_text",
]

SECONDS_PER_HOUR = 3600
NO_ENTRY = -1

RECORD_MAGIC_V1 = 0xD31A_7E01
RECORD_MAGIC = 0xD31A_7E02
_RECORD_HEADER = struct.Struct("<III")
RECORD_HEADER_SIZE = _RECORD_HEADER.size
# v1: deliver_at, scheduled_at, level, queue, tags_code, born, reconsume, sys_flag, ptx, text length
_FIXED = struct.Struct("<qqiiqqiiqI")
# v2: the same fixed fields (the text length now covers topic, host and properties)
_FIXED2 = _FIXED
_SEP = "\x01"

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
_DROP = tuple(sorted(_DELAY_PROPS))

# A version 2 record for the compiled bulk decoder (plugmq.kit.requestcodec): header, then
# _FIXED2 at 12 (deliver_at 12, scheduled_at 20, level 28, queue 32, tags 36, born 44,
# reconsume 52, sys flag 56, prepared offset 60, text length 68), text at 72, body to the end.
_LAYOUT = RequestLayout(
    big_endian=False, magic_at=0, magic=RECORD_MAGIC, length_at=4, length_minus=RECORD_HEADER_SIZE, crc_at=8,
    crc_from=RECORD_HEADER_SIZE, crc_back=0, tail=False, mark_at=-1, mark=0, queue_at=32, tags_at=36, born_at=44,
    reconsume_at=52, sys_flag_at=56, ptx_at=60, text_len_at=68, body_len_at=-1, text_at=72,
    extras=((12, 8), (20, 8), (28, 4)),
)
assert RECORD_HEADER_SIZE + _FIXED2.size == _LAYOUT.text_at


class StoredDelay(NamedTuple):
    """A delay-log record decoded: the request as it is written back (delay properties cleared;
    the log keeps them) and when it is due."""

    request: AppendRequest
    deliver_at_ms: int
    scheduled_at_ms: int
    delay_level: int | None


def encode_text(request: AppendRequest) -> bytes:
    """``topic\\x01host\\x01key\\x01value...`` as UTF-8; ValidationError if a field holds the separator."""
    props = request.properties
    parts = [request.topic, request.born_host]
    for key, value in props.items():
        parts += (key, value)
    text = _SEP.join(parts)
    if text.count(_SEP) != len(parts) - 1:
        bad = next((k for k, v in props.items() if _SEP in k or _SEP in v), "born_host")
        raise ValidationError(f"{bad!r} contains the RocketMQ separator \\x01, which is reserved; "
                              "remove it from the property name and value")
    return text.encode("utf-8")


def encode_record(request: AppendRequest, deliver_at_ms: int, scheduled_at_ms: int, delay_level: int | None) -> bytes:
    text = encode_text(request)
    payload = b"".join((
        _FIXED2.pack(
            deliver_at_ms, scheduled_at_ms, -1 if delay_level is None else delay_level, request.queue_id,
            request.tags_code, request.born_timestamp_ms, request.reconsume_times, request.sys_flag,
            request.prepared_transaction_offset, len(text),
        ),
        text, request.body,
    ))
    return _RECORD_HEADER.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_record(raw: bytes | memoryview) -> StoredDelay:
    """Decode one whole record (header included); CorruptRecordError if it fails its checks."""
    return decode_record_at(bytes(raw), 0, len(raw))



def decode_record_at(buf: bytes, offset: int, size: int) -> StoredDelay:
    """Decode the record of ``size`` bytes at ``offset`` of ``buf`` (a run of the delay log read
    at once); CorruptRecordError if it fails its magic/length/CRC check."""
    if size < RECORD_HEADER_SIZE or offset + size > len(buf):
        raise CorruptRecordError(f"delay log record of {size} bytes at {offset} is cut short")
    magic, length, crc = _RECORD_HEADER.unpack_from(buf, offset)
    start = offset + RECORD_HEADER_SIZE
    end = start + length
    if length != size - RECORD_HEADER_SIZE or zlib.crc32(memoryview(buf)[start:end]) != crc:
        raise CorruptRecordError("delay log record failed its length/CRC check")
    (deliver_at, scheduled_at, level, queue_id, tags_code, born, reconsume, sys_flag, ptx,
     text_len) = _FIXED.unpack_from(buf, start)
    pos = start + _FIXED.size
    if magic == RECORD_MAGIC:
        parts = buf[pos:pos + text_len].decode("utf-8").split(_SEP)
        if len(parts) % 2:
            raise CorruptRecordError("delay log record has an odd number of text fields")
        topic, born_host = parts[0], parts[1]
        props = dict(zip(parts[2::2], parts[3::2]))
        # a record is read only to be written back: the delay properties are cleared
        props.pop(Prop.DELIVER_AT_MS, None)
        props.pop(Prop.DELAY_LEVEL, None)
        # a CRC-checked record of a request validated when it was scheduled: no second validation
        request = AppendRequest.trusted(topic, queue_id, buf[pos + text_len:end], props, tags_code=tags_code,
                                        born_timestamp_ms=born, born_host=born_host, reconsume_times=reconsume,
                                        sys_flag=sys_flag, prepared_transaction_offset=ptx)
    elif magic == RECORD_MAGIC_V1:
        topic, born_host, props = json.loads(buf[pos:pos + text_len].decode("utf-8"))
        for key in _DELAY_PROPS.intersection(props):
            del props[key]
        request = AppendRequest(
            topic=topic, queue_id=queue_id, body=buf[pos + text_len:end], properties=props,
            tags_code=tags_code, born_timestamp_ms=born, born_host=born_host, reconsume_times=reconsume,
            sys_flag=sys_flag, prepared_transaction_offset=ptx,
        )
    else:
        raise CorruptRecordError(f"delay log record has magic {magic:#x}, not a delay record")
    return StoredDelay(request, deliver_at, scheduled_at, None if level < 0 else level)


def decode_records_at(buf: bytes, positions: Sequence[int], sizes: Sequence[int]) -> list[StoredDelay | None]:
    """The records at ``positions`` of ``buf`` (``sizes`` bytes each), None for one that fails
    its checks: decoded in one call by the compiled decoder where it is built (an older record,
    or one it refuses, goes through :func:`decode_record_at`, which decides)."""
    bulk = decode_requests(_LAYOUT, buf, positions, sizes, _DROP)
    out: list[StoredDelay | None] = []
    if bulk is None:
        for position, size in zip(positions, sizes, strict=True):
            try:
                out.append(decode_record_at(buf, position, size))
            except CorruptRecordError:
                out.append(None)
        return out
    requests, extras = bulk
    for i, request in enumerate(requests):
        if request is None:
            try:
                out.append(decode_record_at(buf, positions[i], sizes[i]))
            except CorruptRecordError:
                out.append(None)
            continue
        level = extras[3 * i + 2]
        out.append(StoredDelay(request, extras[3 * i], extras[3 * i + 1], None if level < 0 else level))
    return out


class IndexEntry(NamedTuple):
    offset: int
    size: int
    local_index: int
    global_index: int
    pre_global_index: int
    second: int
    ms: int = 0  # due this many milliseconds into the second


def encode_index_entry(entry: IndexEntry) -> bytes:
    body = _INDEX_BODY.pack(entry.offset, entry.size, entry.local_index, entry.global_index,
                            entry.pre_global_index, entry.second, entry.ms)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_index_entry(raw: bytes | memoryview, at: int = 0) -> IndexEntry | None:
    """The entry at ``at`` of ``raw``, or None when the bytes are not a valid entry (zeros, torn
    or stale)."""
    if len(raw) < at + INDEX_ENTRY_SIZE:
        return None
    offset, size, local, gi, pre, second, ms, crc = _INDEX.unpack_from(raw, at)
    if (crc != zlib.crc32(memoryview(raw)[at:at + _INDEX_BODY.size]) or size == 0
            or second >= SECONDS_PER_HOUR or ms >= 1000):
        return None
    return IndexEntry(offset, size, local, gi, pre, second, ms)


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
