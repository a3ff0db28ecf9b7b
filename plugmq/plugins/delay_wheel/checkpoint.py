"""The wheel's dispatch state: a position in deliver order, and the batch in flight.

Entries are delivered in the order of their key ``(due ms, localIndex)`` (the millisecond level
orders a second by its ``ms``, equal milliseconds by arrival). The position ``(tick_ms, local)``
says every entry whose key is below it is delivered or cancelled. Seed 000 persists (tick,
localIndex) so a new master resumes where the old one stopped, but accepts a re-delivery window
(50 ms of sync lag). Here the state is written around every delivery *batch* — ``INTENT`` (the
entries with keys in ``[position, end)`` are being handed to the broker) before, the advanced
position after — so after a crash at most one batch is in doubt, and the broker's
``was_delivered`` settles it message by message. Two slots written alternately with a sequence
number and CRC: a torn write leaves the previous slot valid.

Version 1 files (whole-second ticks, one entry in flight) are read and converted: their entries
have ``ms`` 0, so ``(tick s, local)`` is the key ``(tick s * 1000, local)``.
"""

from __future__ import annotations

import enum
import os
import struct
import zlib
from pathlib import Path

import attrs

__all__ = ["CheckpointState", "Phase", "WheelCheckpoint"]

_MAGIC = 0xD31A_C4E7
_VERSION = 2
_LAYOUT = struct.Struct("<IHHQqIIqI")  # magic, version, phase, seq, tick, local, end local, end tick, pad
_SLOT = 512  # one sector each, so one slot's write never tears the other


class Phase(enum.IntEnum):
    POSITION = 0  # every key below (tick_ms, local) is delivered or cancelled
    INTENT = 1  # ... and the keys in [(tick_ms, local), (end_ms, end_local)) are being written back
    INTENT_DEAD_LETTER = 2  # version 1 only: one entry being written to the dead-letter topic


@attrs.frozen
class CheckpointState:
    tick_ms: int
    local: int
    phase: Phase = Phase.POSITION
    end_ms: int = 0
    end_local: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return self.tick_ms, self.local

    @property
    def end(self) -> tuple[int, int]:
        return self.end_ms, self.end_local


class WheelCheckpoint:
    def __init__(self, path: Path, *, fsync: bool) -> None:
        self._fsync = fsync
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0
        self.state: CheckpointState | None = None
        best = None
        for slot in range(2):
            raw = os.pread(self._fd, _LAYOUT.size + 4, slot * _SLOT)
            if len(raw) < _LAYOUT.size + 4:
                continue
            (crc,) = struct.unpack_from("<I", raw, _LAYOUT.size)
            if crc != zlib.crc32(raw[:_LAYOUT.size]):
                continue
            magic, version, phase, seq, tick, local, end_local, end_tick, _pad = _LAYOUT.unpack_from(raw)
            if magic != _MAGIC or phase not in Phase._value2member_map_ or version not in (1, _VERSION):
                continue
            if version == 1:  # whole seconds, one entry (hour, gi) in flight at (tick, local)
                state = CheckpointState(tick * 1000, local, Phase(min(phase, Phase.INTENT)),
                                        tick * 1000, local + 1)
            else:
                state = CheckpointState(tick, local, Phase(phase), end_tick, end_local)
            if best is None or seq > best[0]:
                best = (seq, state)
        if best is not None:
            self._seq, self.state = best
        #: The newest position known to be on disk (None before the first write).
        self.durable: tuple[int, int] | None = None if self.state is None else self.state.position

    def write(self, position: tuple[int, int], end: tuple[int, int] | None = None, *,
              sync: bool = False, may_skip_fsync: bool = False) -> None:
        """Record ``position`` (and, with ``end``, the batch in flight up to it). ``sync`` forces
        an fsync; otherwise the ``fsync`` option decides, unless the caller says losing this
        write to a power cut is harmless (``may_skip_fsync``)."""
        self._seq += 1
        phase = Phase.POSITION if end is None else Phase.INTENT
        end_ms, end_local = end if end is not None else (0, 0)
        body = _LAYOUT.pack(_MAGIC, _VERSION, phase, self._seq, position[0], position[1], end_local, end_ms, 0)
        os.pwrite(self._fd, body + struct.pack("<I", zlib.crc32(body)), (self._seq % 2) * _SLOT)
        if sync or (self._fsync and not may_skip_fsync):
            os.fdatasync(self._fd)
        self.durable = position

    def sync(self) -> None:
        """Make every write so far durable."""
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
