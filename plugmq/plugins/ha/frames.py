"""The replication wire format: length-prefixed, CRC-checked frames over one TCP connection
(TLS around it when ``[plugins.ha] tls_cert`` is set: :mod:`plugmq.plugins.ha.tls`).

::

    frame   = type:u8 | length:u32 | crc32(payload):u32 | payload
    HELLO   slave -> master, JSON: version, broker name and id, log format, the slave's end offset
            (optional ``consumer_progress``: lanes its own readers moved while no master was up)
    WELCOME master -> slave, JSON: where the stream starts, the master's offsets (and
            ``consumer_progress_taken`` once the master adopted the slave's readers' progress)
    REFUSE  master -> slave, JSON: why the master will not serve this slave (then it closes)
    DATA    master -> slave: start:u64 | master end:u64 | commit point:u64 | records:u32 | whole
            records of the log (no records: a heartbeat carrying the master's end); the commit point
            is what every in-sync broker holds (a slave's readers see no further)
    ACK     slave -> master: end:u64, the slave's log end once the chunk is appended (and
            flushed with sync flush)
    AUTH, CHALLENGE, PROVE  the handshake with the cluster secret before HELLO
            (:mod:`plugmq.plugins.ha.auth`); after it every frame is followed by a 16-byte tag

A frame is used only once it arrived whole and its CRC holds: a connection torn mid-frame loses
that frame, never half of it, and the slave's store checks every record again.
"""

from __future__ import annotations

import enum
import json
import struct
import zlib
from typing import TYPE_CHECKING, Any

from plugmq.core.errors import ReplicationError

if TYPE_CHECKING:
    from plugmq.plugins.ha.auth import Session
    from plugmq.plugins.ha.tls import Stream

__all__ = ["PROTOCOL_VERSION", "FrameType", "Reader", "ack_frame", "data_frame", "frame", "json_frame", "parse_ack",
           "parse_data", "parse_json"]

PROTOCOL_VERSION = 2  # 2: DATA carries the master's commit point
_HEAD = struct.Struct(">BII")
_DATA = struct.Struct(">QQQI")
_ACK = struct.Struct(">Q")
MAX_FRAME = 64 * 1024 * 1024  # above any transfer batch; a larger length is a broken stream
MAX_HANDSHAKE_FRAME = 4096  # before a peer authenticated, it cannot make the reader allocate more


class FrameType(enum.IntEnum):
    HELLO = 1
    WELCOME = 2
    REFUSE = 3
    DATA = 4
    ACK = 5
    AUTH = 6
    CHALLENGE = 7
    PROVE = 8


_KINDS = frozenset(FrameType)
_TLS_RECORD = 0x16  # the first byte of a TLS ClientHello


def frame(kind: FrameType, payload: bytes) -> bytes:
    return _HEAD.pack(kind, len(payload), zlib.crc32(payload)) + payload


def json_frame(kind: FrameType, body: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(body, separators=(",", ":")).encode())


def data_frame(start: int, master_end: int, commit: int, records: int, data: bytes) -> bytes:
    return frame(FrameType.DATA, _DATA.pack(start, master_end, commit, records) + data)


def ack_frame(end: int) -> bytes:
    return frame(FrameType.ACK, _ACK.pack(end))


def parse_json(payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise ReplicationError(f"replication peer sent a frame that is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ReplicationError(f"replication peer sent {type(body).__name__} where an object was expected")
    return body


def parse_data(payload: bytes) -> tuple[int, int, int, int, bytes]:
    """start, master end, commit point, records, log bytes."""
    if len(payload) < _DATA.size:
        raise ReplicationError(f"DATA frame of {len(payload)} bytes is shorter than its header")
    start, master_end, commit, records = _DATA.unpack_from(payload)
    return start, master_end, commit, records, payload[_DATA.size:]


def parse_ack(payload: bytes) -> int:
    if len(payload) != _ACK.size:
        raise ReplicationError(f"ACK frame of {len(payload)} bytes; expected {_ACK.size}")
    return int(_ACK.unpack(payload)[0])


class Reader:
    """Reads whole frames from a blocking socket or TLS channel (its timeout applies to each receive).

    ``limit``: the largest frame taken (lowered while a peer has not authenticated yet).
    ``session``: once set, every frame must be followed by its authentication tag."""

    def __init__(self, stream: Stream, peer: str, *, limit: int = MAX_FRAME) -> None:
        self.stream = stream
        self._peer = peer
        self._head = bytearray(_HEAD.size)
        self.limit = limit
        self.session: Session | None = None

    def _fill(self, buffer: bytearray | memoryview) -> None:
        view = memoryview(buffer)
        got = 0
        while got < len(view):
            n = self.stream.recv_into(view[got:])
            if n == 0:
                raise ConnectionError(f"replication peer {self._peer} closed the connection")
            got += n

    def read(self) -> tuple[FrameType, bytes]:
        self._fill(self._head)
        kind, length, crc = _HEAD.unpack(self._head)
        if kind not in _KINDS:
            hint = (" (a TLS handshake: that peer runs [plugins.ha] TLS and this side does not)" if kind == _TLS_RECORD
                    else "")
            raise ReplicationError(f"replication peer {self._peer} sent an unknown frame type {kind}{hint}")
        if length > self.limit:
            raise ReplicationError(f"replication peer {self._peer} announced a frame of {length} bytes; the stream is "
                                   "broken (or the peer is not a plugmq replication endpoint)")
        payload = bytearray(length)
        self._fill(payload)
        if self.session is not None:
            tag = bytearray(16)
            self._fill(tag)
            self.session.check(self._head, payload, tag, self._peer)
        if zlib.crc32(payload) != crc:
            raise ReplicationError(f"frame from replication peer {self._peer} failed its CRC check; dropping the "
                                   "connection (it is set up again from the last confirmed offset)")
        return FrameType(kind), bytes(payload)
