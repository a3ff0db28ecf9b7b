"""Record and key encodings of the key-value message store.

A message record is one value keyed by its commit-log offset (8 bytes big-endian, so keys sort
in write order)::

    header (fixed, big-endian) | topic | born host | store host | properties | body

The header holds the total size, a magic, a CRC32 over everything but the body (``record_crc``)
and a CRC32 of the body (``body_crc``), so a flipped bit anywhere is caught on read. Consume-queue,
index and queue-state keys start with the length-prefixed topic, so one queue (or one key of a
topic) is a contiguous key range and every lookup is a range scan.

Shared by store_lmdb and store_rocks (plugins may not import each other, so it lives in the core).
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from collections.abc import Mapping

import attrs

from plugmq.core import (
    AppendRequest,
    CorruptRecordError,
    Prop,
    StoredMessage,
    StoreError,
)

MAGIC = 0xAABBCCDD  # RocketMQ's MESSAGE_MAGIC_CODE; a stale or foreign value never decodes
HEADER = struct.Struct(">IIIIIiiqqqqqqIBIHH")
#: total_size, magic, record_crc, body_crc, queue_id, sys_flag, reconsume_times, queue_offset,
#: commit_log_offset, born_ts, store_ts, prepared_txn_offset, tags_code, body_len, topic_len,
#: props_len, born_host_len, store_host_len
_CRC_FROM = 12  # record_crc covers the header after the first three fields, then the metadata
_PROP = struct.Struct(">HI")
OFFSET = struct.Struct(">Q")
CQ_ENTRY = struct.Struct(">qiq")  # commit_log_offset:int64 | size:int32 | tag_hash:int64
_QUEUE_ID_OFFSET = struct.Struct(">IQ")
_TS_OFFSET = struct.Struct(">QQ")
QUEUE_STATE = struct.Struct(">QQ")  # min offset, max offset
STORE_STATE = struct.Struct(">QQ")  # next commit-log offset, last store timestamp
_HASHED_KEY = 0x8000  # key-length flag: the index key holds a digest of a long message key
_MAX_INLINE_KEY = 200  # keeps index keys under LMDB's 511-byte key limit


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


_cached_text = functools.lru_cache(maxsize=1024)(_text)  # hosts and topics repeat endlessly


def encode_properties(props: Mapping[str, str]) -> bytes:
    parts: list[bytes] = []
    for key, value in props.items():
        kb, vb = key.encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass")
        if len(kb) > 0xFFFF:
            raise StoreError(f"property name {key[:40]!r}... is {len(kb)} bytes; the store allows 65535")
        parts += (_PROP.pack(len(kb), len(vb)), kb, vb)
    return b"".join(parts)


def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    props: dict[str, str] = {}
    pos, end = 0, len(raw)
    while pos < end:
        klen, vlen = _PROP.unpack_from(raw, pos)
        pos += _PROP.size
        key = bytes(raw[pos:pos + klen]).decode("utf-8", "surrogatepass")
        pos += klen
        props[key] = bytes(raw[pos:pos + vlen]).decode("utf-8", "surrogatepass")
        pos += vlen
    if pos != end:
        raise CorruptRecordError("properties overrun their length")
    return props


@attrs.define(slots=True)
class Prepared:
    """A request encoded outside the write lock: only offsets and the store time remain to fill."""

    request: AppendRequest
    meta: bytes  # topic | born host | store host | properties
    meta_crc: int
    body_crc: int
    topic_len: int
    props_len: int
    born_host_len: int
    store_host_len: int
    size: int
    index_keys: tuple[bytes, ...]  # topic-prefixed index-key prefixes
    queue_key: bytes  # topic-prefixed queue prefix


def prepare(request: AppendRequest, store_host: str, max_body: int) -> Prepared:
    """Check a request against the store's limits and encode everything offset-independent."""
    if len(request.body) > max_body:
        raise StoreError(
            f"message body for topic {request.topic!r} is {len(request.body)} bytes; this store takes at most "
            f"{max_body} (the broker's max_message_size plus room for its own records); split the payload"
        )
    topic = _cached_text(request.topic)
    if not 0 < len(topic) <= 255:
        raise StoreError(f"topic {request.topic!r} must be 1 to 255 bytes")
    born, store = _cached_text(request.born_host), _cached_text(store_host)
    if len(born) > 0xFFFF or len(store) > 0xFFFF:
        raise StoreError("born/store host longer than 65535 bytes")
    props = encode_properties(request.properties)
    try:  # a field out of its fixed width must fail here, not inside a group commit
        HEADER.pack(0, MAGIC, 0, 0, request.queue_id, request.sys_flag, request.reconsume_times, 0, 0,
                    request.born_timestamp_ms, 0, request.prepared_transaction_offset, request.tags_code,
                    len(request.body), len(topic), len(props), len(born), len(store))
    except struct.error as exc:
        raise StoreError(f"a field of the message for topic {request.topic!r} is out of range: {exc}") from exc
    meta = b"".join((topic, born, store, props))
    keys = set(request.keys)
    uniq = request.properties.get(Prop.UNIQ_KEY)
    if uniq:
        keys.add(uniq)
    return Prepared(
        request=request,
        meta=meta,
        meta_crc=zlib.crc32(meta),
        body_crc=zlib.crc32(request.body),
        topic_len=len(topic),
        props_len=len(props),
        born_host_len=len(born),
        store_host_len=len(store),
        size=HEADER.size + len(meta) + len(request.body),
        index_keys=tuple(index_prefix(request.topic, key) for key in sorted(keys)),
        queue_key=queue_prefix(request.topic, request.queue_id),
    )


def encode_record(p: Prepared, queue_offset: int, commit_log_offset: int, store_ts: int) -> bytes:
    r = p.request
    header = bytearray(HEADER.pack(
        p.size, MAGIC, 0, p.body_crc, r.queue_id, r.sys_flag, r.reconsume_times, queue_offset,
        commit_log_offset, r.born_timestamp_ms, store_ts, r.prepared_transaction_offset, r.tags_code,
        len(r.body), p.topic_len, p.props_len, p.born_host_len, p.store_host_len,
    ))
    struct.pack_into(">I", header, 8, zlib.crc32(memoryview(header)[_CRC_FROM:], p.meta_crc))
    return b"".join((header, p.meta, r.body))


@attrs.frozen
class Header:
    size: int
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_ts: int
    tags_code: int
    topic: str


def _check_header(raw: bytes | memoryview) -> tuple:
    if len(raw) < HEADER.size:
        raise CorruptRecordError(f"record of {len(raw)} bytes is shorter than its header")
    fields = HEADER.unpack_from(raw, 0)
    total, magic, record_crc = fields[0], fields[1], fields[2]
    if magic != MAGIC:
        raise CorruptRecordError(f"bad magic {magic:#x}")
    if total != len(raw):
        raise CorruptRecordError(f"record says {total} bytes but {len(raw)} are stored")
    body_len, topic_len, props_len, born_len, store_len = fields[13:18]
    meta_len = topic_len + born_len + store_len + props_len
    if HEADER.size + meta_len + body_len != total:
        raise CorruptRecordError("field lengths do not add up to the record size")
    view = memoryview(raw)
    meta_crc = zlib.crc32(view[HEADER.size:HEADER.size + meta_len])
    if zlib.crc32(view[_CRC_FROM:HEADER.size], meta_crc) != record_crc:
        raise CorruptRecordError("record CRC mismatch (header or metadata damaged)")
    return fields


def decode_header(raw: bytes | memoryview) -> Header:
    """The fields retention and recovery need, after the header and metadata CRC check."""
    f = _check_header(raw)
    topic = bytes(raw[HEADER.size:HEADER.size + f[14]]).decode("utf-8")
    return Header(size=f[0], queue_id=f[4], queue_offset=f[7], commit_log_offset=f[8], store_ts=f[10],
                  tags_code=f[12], topic=topic)


def decode_record(raw: bytes | memoryview) -> StoredMessage:
    """Decode and fully verify a record; CorruptRecordError if any check fails."""
    f = _check_header(raw)
    (total, _magic, _rcrc, body_crc, queue_id, sys_flag, reconsume, queue_offset, commit_log_offset,
     born_ts, store_ts, prepared, tags_code, body_len, topic_len, props_len, born_len, store_len) = f
    view = memoryview(raw)
    pos = HEADER.size
    topic = bytes(view[pos:pos + topic_len]).decode("utf-8")
    pos += topic_len
    born_host = bytes(view[pos:pos + born_len]).decode("utf-8", "surrogatepass")
    pos += born_len
    store_host = bytes(view[pos:pos + store_len]).decode("utf-8", "surrogatepass")
    pos += store_len
    props = decode_properties(view[pos:pos + props_len])
    pos += props_len
    body = bytes(view[pos:pos + body_len])
    if zlib.crc32(body) != body_crc:
        raise CorruptRecordError(f"body CRC mismatch at commit-log offset {commit_log_offset}")
    return StoredMessage(
        topic=topic, queue_id=queue_id, body=body, properties=props, queue_offset=queue_offset,
        commit_log_offset=commit_log_offset, size=total, tags_code=tags_code, born_timestamp_ms=born_ts,
        store_timestamp_ms=store_ts, born_host=born_host, store_host=store_host, reconsume_times=reconsume,
        sys_flag=sys_flag, prepared_transaction_offset=prepared, body_crc=body_crc,
    )


# ---------------------------------------------------------------------------------------------
# keys
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def topic_prefix(topic: str) -> bytes:
    raw = _text(topic)
    return bytes((len(raw),)) + raw


@functools.lru_cache(maxsize=65536)
def queue_prefix(topic: str, queue_id: int) -> bytes:
    """Key prefix of one queue: its consume-queue entries and its state share it."""
    return topic_prefix(topic) + queue_id.to_bytes(4, "big")


def cq_key(prefix: bytes, queue_offset: int) -> bytes:
    return prefix + OFFSET.pack(queue_offset)


def split_queue_key(key: bytes) -> tuple[str, int]:
    tlen = key[0]
    return key[1:1 + tlen].decode("utf-8"), int.from_bytes(key[1 + tlen:5 + tlen], "big")


def index_prefix(topic: str, key: str) -> bytes:
    raw = _text(key)
    if len(raw) > _MAX_INLINE_KEY:
        raw = hashlib.sha256(raw).digest()
        return topic_prefix(topic) + (_HASHED_KEY | len(raw)).to_bytes(2, "big") + raw
    return topic_prefix(topic) + len(raw).to_bytes(2, "big") + raw


def index_key(prefix: bytes, store_ts: int, commit_log_offset: int) -> bytes:
    return prefix + _TS_OFFSET.pack(store_ts, commit_log_offset)


def split_index_key(key: bytes, prefix_len: int) -> tuple[int, int]:
    return _TS_OFFSET.unpack_from(key, prefix_len)


def index_keys_of(message: StoredMessage) -> list[bytes]:
    keys = set(message.keys)
    if message.unique_id:
        keys.add(message.unique_id)
    return [index_key(index_prefix(message.topic, k), message.store_timestamp_ms, message.commit_log_offset)
            for k in sorted(keys)]


def has_key(message: StoredMessage, key: str) -> bool:
    return key in message.keys or message.unique_id == key
