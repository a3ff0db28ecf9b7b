"""The wheel's dispatch state: tick + localIndex within the second, and the in-doubt delivery.

Seed 000 persists (tick, localIndex) so a new master resumes where the old one stopped, but
accepts a re-delivery window (50 ms of sync lag). Here the state is written around every
delivery — ``INTENT`` (this entry is being handed to the broker) before, the advanced position
after — so after a crash at most one delivery is in doubt, and the broker's ``was_delivered``
settles it. Two slots written alternately with a sequence number and CRC: a torn write leaves
the previous slot valid.
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
_LAYOUT = struct.Struct("<IHHQqIIqI")
_SLOT = 512  # one sector each, so one slot's write never tears the other


class Phase(enum.IntEnum):
    POSITION = 0  # everything before (tick, local) is delivered or cancelled
    INTENT = 1  # (tick, local) = entry (hour, gi) is being written back to its topic
    INTENT_DEAD_LETTER = 2  # ... being written to the dead-letter topic


@attrs.frozen
class CheckpointState:
    tick: int
    local: int
    phase: Phase = Phase.POSITION
    hour: int = 0
    global_index: int = 0


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
            magic, _version, phase, seq, tick, local, gi, hour, _pad = _LAYOUT.unpack_from(raw)
            if magic != _MAGIC or phase not in Phase._value2member_map_:
                continue
            if best is None or seq > best[0]:
                best = (seq, CheckpointState(tick, local, Phase(phase), hour, gi))
        if best is not None:
            self._seq, self.state = best
        self.durable_tick: int | None = None if self.state is None else self.state.tick

    def write(self, tick: int, local: int, phase: Phase = Phase.POSITION, hour: int = 0,
              global_index: int = 0, *, sync: bool = False, may_skip_fsync: bool = False) -> None:
        """``sync`` forces an fsync; otherwise the ``fsync`` option decides, unless the caller
        says losing this write to a power cut is harmless (``may_skip_fsync``)."""
        self._seq += 1
        body = _LAYOUT.pack(_MAGIC, 1, phase, self._seq, tick, local, global_index, hour, 0)
        os.pwrite(self._fd, body + struct.pack("<I", zlib.crc32(body)), (self._seq % 2) * _SLOT)
        if sync or (self._fsync and not may_skip_fsync):
            os.fdatasync(self._fd)
        self.durable_tick = tick

    def close(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
