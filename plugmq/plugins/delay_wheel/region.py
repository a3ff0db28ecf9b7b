"""One file read and written either through an mmap (near hours) or pread/pwrite (far hours).

Seed 000 maps only the nearest two hours: a mapped region is preallocated (sparse) and grows by
doubling, so appends are memory copies; an unmapped region costs no memory at all and is written
with positional syscalls. Unmapping trims the preallocated tail back to the logical size.
"""

from __future__ import annotations

import mmap
import os
import struct

__all__ = ["Region"]

_PAGE = mmap.PAGESIZE


def _round_up(size: int) -> int:
    return max(_PAGE, -(-size // _PAGE) * _PAGE)


class Region:
    def __init__(self, path: str, *, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._mm: mmap.mmap | None = None
        self._capacity = 0

    @property
    def mapped(self) -> bool:
        return self._mm is not None

    def file_size(self) -> int:
        return os.fstat(self._fd).st_size

    def map(self, initial: int) -> None:
        if self._mm is not None:
            return
        size = _round_up(max(self.file_size(), initial))
        if self.file_size() < size:
            os.ftruncate(self._fd, size)
        self._mm = mmap.mmap(self._fd, size)
        self._capacity = size

    def unmap(self, logical_size: int | None) -> None:
        if self._mm is None:
            return
        if self._fsync:
            self._mm.flush()
        self._mm.close()
        self._mm = None
        self._capacity = 0
        if logical_size is not None and self.file_size() > logical_size:
            os.ftruncate(self._fd, logical_size)

    def _grow(self, needed: int) -> None:
        assert self._mm is not None
        size = _round_up(max(needed, self._capacity * 2))
        self._mm.close()
        os.ftruncate(self._fd, size)
        self._mm = mmap.mmap(self._fd, size)
        self._capacity = size

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if self._mm is not None:
            if end > self._capacity:
                self._grow(end)
            self._mm[offset:end] = data
        else:
            os.pwrite(self._fd, data, offset)

    def read(self, offset: int, size: int) -> bytes:
        if self._mm is not None:
            return self._mm[offset:min(offset + size, self._capacity)]
        return os.pread(self._fd, size, offset)

    def unpack(self, layout: struct.Struct, offset: int) -> tuple:
        if self._mm is not None:
            return layout.unpack_from(self._mm, offset)
        return layout.unpack(os.pread(self._fd, layout.size, offset))

    def sync(self, offset: int = 0, size: int | None = None) -> None:
        """Make [offset, offset + size) durable (the whole file when size is None)."""
        if self._mm is None:
            os.fdatasync(self._fd)
        elif size is None:
            self._mm.flush()
        else:
            start = offset - offset % _PAGE  # msync wants a page-aligned start
            self._mm.flush(start, min(offset + size, self._capacity) - start)

    def close(self, logical_size: int | None = None, *, sync: bool = False) -> None:
        if self._fd < 0:
            return
        if sync:
            self.sync()
        self.unmap(logical_size)
        os.close(self._fd)
        self._fd = -1
