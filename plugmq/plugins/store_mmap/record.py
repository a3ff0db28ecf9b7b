"""The commit-log record format (big-endian, RocketMQ's field order with two additions).

::

    off  size  field
      0   4    total size (whole record)
      4   4    magic (MESSAGE_MAGIC; BLANK_MAGIC marks the end-of-file filler of a segment)
      8   4    record CRC32: bytes [12, 100) seeded with the CRC of the tail (topic + properties),
               so every field except the body is covered; the body is covered by the body CRC,
               which the record CRC covers in turn
     12   4    body CRC32 (zlib.crc32)
     16   4    queue id
     20   4    flag (bit 0: the born host is not IPv4 and travels in a private property)
     24   8    queue offset
     32   8    physical (commit-log) offset
     40   4    sys flag
     44   8    born timestamp (ms)
     52   8    born host (IPv4 + port)
     60   8    store timestamp (ms)
     68   8    store host (IPv4 + port)
     76   4    reconsume times
     80   8    prepared-transaction offset
     88   8    tags code (the consume-queue tag field; kept so the queue can be rebuilt exactly)
     96   4    body length
    100   n    body
          1    topic length, then the topic (ASCII, <= 127)
          2    properties length, then the properties (UTF-8 ``key\\x01value\\x02``...)

The blank filler is ``total size | BLANK_MAGIC`` followed by zeros to the end of the segment.
The offsets, magics and sizes are defined once, in :mod:`.layout` (the compiled kernels include
a header generated from it).
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Mapping

from plugmq.core import StoredMessage, StoreError, ValidationError
from plugmq.plugins.store_mmap.layout import BLANK, CONSTANTS, HEAD

__all__ = [
    "BLANK",
    "BLANK_MAGIC",
    "END_FILE_MIN_BLANK",
    "HEAD",
    "HEADER_SIZE",
    "MESSAGE_MAGIC",
    "QUEUE_AND_PHYS",
    "QUEUE_AND_PHYS_AT",
    "RCRC",
    "RECORD_CRC_AT",
    "RECORD_CRC_FROM",
    "STORE_TS",
    "STORE_TS_AT",
    "Decoded",
    "decode",
    "host_bytes",
    "parse_properties",
    "record_struct",
    "serialize_properties",
]

MESSAGE_MAGIC = CONSTANTS["MESSAGE_MAGIC"]
BLANK_MAGIC = CONSTANTS["BLANK_MAGIC"]
END_FILE_MIN_BLANK = CONSTANTS["END_FILE_MIN_BLANK"]

HEADER_SIZE = HEAD.size  # 100
RCRC = struct.Struct(">I")
# Fields only known under the put lock, patched into a record serialised beforehand.
QUEUE_AND_PHYS = struct.Struct(">qq")
QUEUE_AND_PHYS_AT = CONSTANTS["OFF_QUEUE_OFFSET"]
STORE_TS = struct.Struct(">q")
STORE_TS_AT = CONSTANTS["OFF_STORE_TS"]
RECORD_CRC_AT = CONSTANTS["OFF_RECORD_CRC"]
RECORD_CRC_FROM = CONSTANTS["RECORD_CRC_FROM"]
_PROPLEN = struct.Struct(">H")
_TOPIC_AND_PROPLEN = CONSTANTS["TOPIC_LEN_SIZE"] + CONSTANTS["PROPS_LEN_SIZE"]
MAX_PROPERTIES_BYTES = CONSTANTS["MAX_PROPERTIES_BYTES"]
_MAX_TOPIC = CONSTANTS["MAX_TOPIC_BYTES"]
FLAG_BORN_HOST_IN_PROPS = CONSTANTS["FLAG_BORN_HOST_IN_PROPS"]
BORN_HOST_PROPERTY = "__PLUGMQ_BORN_HOST"

_STRUCTS: dict[tuple[int, int], struct.Struct] = {}
_STRUCT_CACHE_LIMIT = 1024


def record_struct(body_len: int, tail_len: int) -> struct.Struct:
    """The whole record as one Struct (header, body, tail), cached by the two lengths, so a write
    is a single ``pack_into`` into the mapping."""
    key = (body_len, tail_len)
    st = _STRUCTS.get(key)
    if st is None:
        if len(_STRUCTS) >= _STRUCT_CACHE_LIMIT:
            _STRUCTS.clear()
        st = _STRUCTS[key] = struct.Struct(f"{HEAD.format}{body_len}s{tail_len}s")
    return st


_HOSTS: dict[str, bytes | None] = {}


def host_bytes(host: str) -> bytes | None:
    """IPv4 ``a.b.c.d:port`` as 8 bytes (address + int32 port), or None if not of that form."""
    packed = _HOSTS.get(host, b"")
    if packed != b"":
        return packed
    address, _, port = host.rpartition(":")
    try:
        packed = ipaddress.IPv4Address(address).packed + struct.pack(">i", int(port))
    except (ValueError, struct.error):
        packed = None
    if len(_HOSTS) > 4096:
        _HOSTS.clear()
    _HOSTS[host] = packed
    return packed


_HOST_TEXTS: dict[bytes, str] = {}


def host_text(raw: bytes) -> str:
    """``a.b.c.d:port`` of 8 stored bytes (cached: a store sees few hosts, every read asks)."""
    text = _HOST_TEXTS.get(raw)
    if text is None:
        port = struct.unpack_from(">i", raw, 4)[0]
        text = f"{ipaddress.IPv4Address(raw[:4])}:{port}"
        if len(_HOST_TEXTS) > 4096:
            _HOST_TEXTS.clear()
        _HOST_TEXTS[bytes(raw)] = text
    return text


def serialize_properties(props: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String."""
    if not props:
        return b""
    text = "".join([f"{k}\x01{v}\x02" for k, v in props.items()])
    if not all(type(k) is str and type(v) is str for k, v in props.items()):
        for k, v in props.items():
            if not isinstance(k, str):
                raise ValidationError(f"property names must be strings, got {k!r}")
            if not isinstance(v, str):
                raise ValidationError(f"property {k!r} must be a string, got {type(v).__name__}")
    if text.count("\x01") != len(props) or text.count("\x02") != len(props):
        bad = next(k for k, v in props.items() if "\x01" in k + v or "\x02" in k + v)
        raise ValidationError(
            f"property {bad!r} contains \\x01 or \\x02, the separators of the stored property string"
        )
    return text.encode("utf-8", "surrogatepass")


def parse_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    out = {}
    for item in raw.decode("utf-8", "surrogatepass").split("\x02"):
        if item:
            key, _, value = item.partition("\x01")
            out[key] = value
    return out


def topic_part(topic: str) -> bytes:
    raw = topic.encode("ascii")
    if len(raw) > _MAX_TOPIC:
        raise StoreError(f"topic {topic[:40]!r}... is {len(raw)} bytes; a record holds at most {_MAX_TOPIC}")
    return bytes((len(raw),)) + raw


def build_tail(topic_prefix: bytes, props: bytes) -> bytes:
    if len(props) > MAX_PROPERTIES_BYTES:
        raise StoreError(
            f"serialized properties are {len(props)} bytes; a record holds at most {MAX_PROPERTIES_BYTES} "
            f"(move large values into the body)"
        )
    return b"".join((topic_prefix, _PROPLEN.pack(len(props)), props))


class Decoded:
    """A validated record's fields (what recovery and reads need)."""

    __slots__ = (
        "body",
        "body_crc",
        "born_host",
        "born_ts",
        "flag",
        "phys",
        "prepared",
        "props_raw",
        "queue_id",
        "queue_offset",
        "reconsume",
        "store_host",
        "store_ts",
        "sys_flag",
        "tags_code",
        "topic",
        "total",
    )
    body: bytes
    body_crc: int
    born_host: bytes
    born_ts: int
    flag: int
    phys: int
    prepared: int
    props_raw: bytes
    queue_id: int
    queue_offset: int
    reconsume: int
    store_host: bytes
    store_ts: int
    sys_flag: int
    tags_code: int
    topic: str
    total: int

    def properties(self) -> dict[str, str]:
        return parse_properties(self.props_raw)

    def born_host_text(self, props: dict[str, str]) -> str:
        if self.flag & FLAG_BORN_HOST_IN_PROPS:
            return props.pop(BORN_HOST_PROPERTY, "0.0.0.0:0")
        return host_text(self.born_host)

    def keys_and_uniq(self) -> tuple[str, ...]:
        props = self.properties()
        keys = props.get("KEYS", "").split()
        uniq = props.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX")
        if uniq:
            keys.append(uniq)
        return tuple(keys)

    def to_stored(self, size: int) -> StoredMessage:
        props = self.properties()
        born = self.born_host_text(props)
        return StoredMessage.trusted(
            self.topic, self.queue_id, self.body, props, self.queue_offset, self.phys, size, self.tags_code,
            self.born_ts, self.store_ts, born, host_text(self.store_host), self.reconsume, self.sys_flag,
            self.prepared, self.body_crc,
        )


_MIN_RECORD = CONSTANTS["MIN_RECORD"]


def decode(buf: object, pos: int, avail: int, phys: int, *, verify_crc: bool = True) -> Decoded | None:
    """Parse and check the record at ``pos`` of ``buf`` (``avail`` readable bytes from ``pos``),
    which must sit at commit-log offset ``phys``. None unless magic, sizes, offset and CRCs hold.
    The caller checks for BLANK_MAGIC first."""
    if avail < _MIN_RECORD:
        return None
    fields = HEAD.unpack_from(buf, pos)  # type: ignore[arg-type]
    total = fields[0]
    if fields[1] != MESSAGE_MAGIC or total < _MIN_RECORD or total > avail or fields[7] != phys:
        return None
    body_len = fields[16]
    tail_at = pos + HEADER_SIZE + body_len
    end = pos + total
    if body_len < 0 or tail_at + _TOPIC_AND_PROPLEN > end or fields[4] < 0 or fields[6] < 0:
        return None
    raw = buf[tail_at:end]  # type: ignore[index]
    topic_len = raw[0]
    if 1 + topic_len + 2 > len(raw):
        return None
    props_len = _PROPLEN.unpack_from(raw, 1 + topic_len)[0]
    if 1 + topic_len + 2 + props_len != len(raw):
        return None
    if verify_crc:
        header = buf[pos + 12 : pos + HEADER_SIZE]  # type: ignore[index]
        if zlib.crc32(header, zlib.crc32(raw)) != fields[2]:
            return None
    body = buf[pos + HEADER_SIZE : tail_at]  # type: ignore[index]
    if verify_crc and zlib.crc32(body) != fields[3]:
        return None
    rec = Decoded()
    rec.total = total
    rec.body_crc = fields[3]
    rec.queue_id = fields[4]
    rec.flag = fields[5]
    rec.queue_offset = fields[6]
    rec.phys = phys
    rec.sys_flag = fields[8]
    rec.born_ts = fields[9]
    rec.born_host = fields[10]
    rec.store_ts = fields[11]
    rec.store_host = fields[12]
    rec.reconsume = fields[13]
    rec.prepared = fields[14]
    rec.tags_code = fields[15]
    rec.body = bytes(body)
    try:
        rec.topic = bytes(raw[1 : 1 + topic_len]).decode("ascii")
    except UnicodeDecodeError:
        return None
    rec.props_raw = bytes(raw[3 + topic_len :])
    return rec
