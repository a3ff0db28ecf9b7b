"""The dispatch log of one schedule segment: what became of its messages.

QMQ's dispatch log holds only the 8-byte sequence of every delivered message (seed 001). Here a
record is 16 bytes and typed, so the one file per segment is also its cancel log and its
delivery-intent log::

    1 kind (I intent, D delivered, C cancelled, M moved) | 3 pad | 4 crc32(kind + sequence) | 8 sequence

The order of writes is: I records for a batch (fsynced), the deliveries, then D records. After a
crash an I without a D is "in doubt": recovery asks the broker whether that message reached its
topic (``DelayContext.was_delivered``) instead of guessing, so it is neither lost nor doubled.
A segment whose D, C and M records cover every message is done, and is deleted with its log.
M (moved) is a cancel whose message was rescheduled: it lives on in a later record of the message
log, so a cancel of the old id answers False.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.logs import get_logger
from plugmq.kit.native import load_kernel
from plugmq.plugins.delay_schedule.layout import DISPATCH, DISPATCH_CRC_PART, SEGSCAN

__all__ = ["CANCELLED", "DELIVERED", "INTENT", "MOVED", "DispatchState", "encode_dispatch", "read_dispatch_log"]

log = get_logger(__name__)

_segscan: Any = load_kernel(SEGSCAN)  # None: encode_dispatch_python

INTENT = ord("I")
DELIVERED = ord("D")
CANCELLED = ord("C")
MOVED = ord("M")
_KINDS = {INTENT, DELIVERED, CANCELLED, MOVED}
_RECORD = DISPATCH
_CRC_PART = DISPATCH_CRC_PART
RECORD_SIZE = _RECORD.size


@attrs.define
class DispatchState:
    """What a segment's dispatch log says, in memory."""

    delivered: set[int] = attrs.field(factory=set)
    cancelled: set[int] = attrs.field(factory=set)
    intents: set[int] = attrs.field(factory=set)
    moved: set[int] = attrs.field(factory=set)  # a subset of cancelled
    size: int = 0

    @property
    def settled_count(self) -> int:
        return len(self.delivered) + len(self.cancelled)

    def is_settled(self, seq: int) -> bool:
        return seq in self.delivered or seq in self.cancelled

    def in_doubt(self) -> set[int]:
        return self.intents - self.delivered - self.cancelled

    def apply(self, kind: int, seq: int) -> None:
        if kind == DELIVERED:
            self.delivered.add(seq)
            self.intents.discard(seq)
        elif kind == CANCELLED:
            self.cancelled.add(seq)
        elif kind == MOVED:
            self.cancelled.add(seq)
            self.moved.add(seq)
        else:
            self.intents.add(seq)

    def apply_many(self, kind: int, seqs: Iterable[int]) -> None:
        """``apply`` for a batch of the same kind, as set operations (a burst marks thousands)."""
        if kind == DELIVERED:
            seqs = set(seqs)
            self.delivered |= seqs
            self.intents -= seqs
        elif kind == CANCELLED:
            self.cancelled.update(seqs)
        elif kind == MOVED:
            self.cancelled.update(seqs)
            self.moved.update(seqs)
        else:
            self.intents.update(seqs)


def encode_dispatch(kind: int, seqs: Iterable[int]) -> bytes:
    """The records of ``kind`` for ``seqs`` (compiled where delay_schedule's _segscan is built)."""
    if _segscan is not None:
        return bytes(_segscan.encode_dispatch(kind, seqs if isinstance(seqs, (list, tuple)) else list(seqs)))
    return encode_dispatch_python(kind, seqs)


def encode_dispatch_python(kind: int, seqs: Iterable[int]) -> bytes:
    """:func:`encode_dispatch` in Python (the compiled one's reference), refusing what it refuses."""
    if not 0 <= kind <= 255:
        raise ValueError("kind must be a byte")
    try:
        return b"".join(_RECORD.pack(kind, zlib.crc32(_CRC_PART.pack(kind, s)), s) for s in seqs)
    except struct.error as exc:
        raise OverflowError(f"a dispatch-log sequence must fit int64 ({exc})") from exc


def read_dispatch_log(path: Path | str) -> DispatchState:
    """Read a dispatch log, cutting a torn or corrupt tail (it can only be the last write)."""
    state = DispatchState()
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return state
    pos = 0
    while pos + RECORD_SIZE <= len(data):
        kind, crc, seq = _RECORD.unpack_from(data, pos)
        if kind not in _KINDS or zlib.crc32(_CRC_PART.pack(kind, seq)) != crc:
            break
        state.apply(kind, seq)
        pos += RECORD_SIZE
    if pos != len(data):
        log.warning("dispatch log tail cut", path=str(path), valid=pos, size=len(data))
        with path.open("r+b") as f:
            f.truncate(pos)
    state.size = pos
    return state
