"""Per-level dispatch offsets (RocketMQ's ``delayOffset.json``), rewritten after every batch.

RocketMQ persists this table every 10 s, so a restart re-delivers up to 10 s of every level.
Here it is written after every delivery batch, so it must be cheap: ``offsets.bin`` holds two
4 KiB slots written alternately, each ``magic | version | seq | count | offsets... | crc32``.
A torn or lost write leaves the other slot valid, and the newest valid slot wins at open. (A
JSON file replaced by rename costs ~1.5 ms per write on ext4 even without fsync — the rename
forces the data out — against ~10 us for a positional write; that is the reason for the format.)
What was delivered after the last persist is settled at start-up by ``was_delivered``.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from plugmq.core.errors import DelayError

__all__ = ["MAX_QUEUES", "OffsetTable"]

_MAGIC = 0xDE1A_7E7E
_VERSION = 1
_HEAD = struct.Struct("<IHHQI")
_SLOT = 4096
MAX_QUEUES = (_SLOT - _HEAD.size - 4) // 8


class OffsetTable:
    """Queue id -> next consume-queue offset to deliver, for the schedule topic's queues."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self.offsets: dict[int, int] = {}
        self.persists = 0
        self._seq = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        best: tuple[int, list[int]] | None = None
        for slot in range(2):
            found = self._read_slot(slot)
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None and os.fstat(self._fd).st_size > 0:
            raise DelayError(
                f"delay_level offset file {path} has no valid slot (both fail their checksum); one slot is always "
                f"intact after a crash, so this is outside damage: restore it, or delete it to re-deliver from 0"
            )
        if best is not None:
            self._seq = best[0]
            self.offsets = dict(enumerate(best[1]))

    def _read_slot(self, slot: int) -> tuple[int, list[int]] | None:
        raw = os.pread(self._fd, _SLOT, slot * _SLOT)
        if len(raw) < _HEAD.size + 4:
            return None
        magic, version, _pad, seq, count = _HEAD.unpack_from(raw)
        end = _HEAD.size + 8 * count
        if magic != _MAGIC or version != _VERSION or count > MAX_QUEUES or len(raw) < end + 4:
            return None
        (crc,) = struct.unpack_from("<I", raw, end)
        if crc != zlib.crc32(raw[:end]):
            return None
        return seq, list(struct.unpack_from(f"<{count}q", raw, _HEAD.size))

    def get(self, queue_id: int) -> int:
        return self.offsets.get(queue_id, 0)

    def set(self, queue_id: int, offset: int) -> None:
        if queue_id >= MAX_QUEUES:
            raise DelayError(f"delay_level keeps offsets for at most {MAX_QUEUES} levels, got queue {queue_id}")
        self.offsets[queue_id] = offset

    def persist(self, *, sync: bool = False) -> None:
        if self._fd < 0:
            raise DelayError(f"delay_level offset file {self.path} is closed")
        count = max(self.offsets, default=-1) + 1
        values = [self.offsets.get(q, 0) for q in range(count)]
        self._seq += 1
        body = _HEAD.pack(_MAGIC, _VERSION, 0, self._seq, count) + struct.pack(f"<{count}q", *values)
        os.pwrite(self._fd, body + struct.pack("<I", zlib.crc32(body)), (self._seq % 2) * _SLOT)
        if self._fsync or sync:
            os.fdatasync(self._fd)
        self.persists += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
