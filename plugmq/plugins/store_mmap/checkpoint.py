"""The checkpoint file: how far the commit log, the consume queues and the index are durable.

RocketMQ keeps three timestamps in a 4 KiB ``checkpoint`` file; here each part records the
commit-log *offset* (a record boundary) below which it is durable, plus the store time of that
moment. A CRC makes a torn checkpoint recognisable: it is then ignored and recovery re-checks
the whole log. Written through a mapping and made durable with fdatasync.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import attrs

from plugmq.plugins.store_mmap.mapped_file import MappedFile

__all__ = ["Checkpoint", "CheckpointData"]

_MAGIC = 0x504D_434B  # "PMCK"
_FIELDS = struct.Struct(">Iqqqqqq")
_CRC = struct.Struct(">I")
_SIZE = 4096


@attrs.frozen
class CheckpointData:
    """Offsets are commit-log record boundaries; timestamps are store times (ms)."""

    commit_log_offset: int = 0
    commit_log_ts: int = 0
    consume_queue_offset: int = 0
    consume_queue_ts: int = 0
    index_offset: int = 0
    index_ts: int = 0

    @property
    def min_offset(self) -> int:
        return min(self.commit_log_offset, self.consume_queue_offset, self.index_offset)


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        if path.exists() and os.path.getsize(path) == _SIZE:
            self._mf = MappedFile.open(path, 0)
            try:
                self._mf.reserve(_SIZE)  # older versions left it sparse until its first write
            except BaseException:
                self._mf.close()
                raise
        else:
            self._mf = MappedFile.create(path, 0, _SIZE, sync_dir=True)

    def read(self) -> CheckpointData | None:
        """The last written checkpoint, or None if there is none or it is torn."""
        mm = self._mf.mm
        fields = _FIELDS.unpack_from(mm, 0)
        (crc,) = _CRC.unpack_from(mm, _FIELDS.size)
        if fields[0] != _MAGIC or zlib.crc32(mm[: _FIELDS.size]) != crc:
            return None
        return CheckpointData(*fields[1:])

    def write(self, data: CheckpointData) -> None:
        raw = _FIELDS.pack(
            _MAGIC,
            data.commit_log_offset,
            data.commit_log_ts,
            data.consume_queue_offset,
            data.consume_queue_ts,
            data.index_offset,
            data.index_ts,
        )
        mm = self._mf.mm
        mm[: len(raw)] = raw
        _CRC.pack_into(mm, len(raw), zlib.crc32(raw))
        self._mf.flush()

    def close(self) -> None:
        self._mf.close()
