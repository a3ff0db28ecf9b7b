"""File helpers: a bounded cache of open descriptors, atomic small-file writes, directory fsync.

With one schedule segment per bucket (up to ~1M files for two years of one-minute buckets, as the
seed notes), keeping every segment open would exhaust the descriptor limit; the LRU keeps the
hot ones (the buckets being filled and the ones being dispatched) open.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

__all__ = ["FdCache", "atomic_write", "fsync_dir"]


def fsync_dir(directory: Path) -> None:
    """Make a create/rename/unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool) -> None:
    """Replace ``path`` with ``data`` so a reader (or a restart) sees the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


class FdCache:
    """Read-write descriptors by path, least recently used closed first.

    ``dirty`` paths were written since their last fsync; an evicted dirty descriptor is fsynced
    first when ``fsync`` is on, so eviction never weakens durability.
    """

    def __init__(self, capacity: int, *, fsync: bool) -> None:
        self._capacity = capacity
        self._fsync = fsync
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._dirty: set[str] = set()

    def get(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fds[path] = fd
        while len(self._fds) > self._capacity:
            old, old_fd = self._fds.popitem(last=False)
            self._close(old, old_fd)
        return fd

    def write(self, path: str, position: int, data: bytes) -> None:
        fd = self.get(path)
        written = os.pwrite(fd, data, position)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        self._dirty.add(path)

    def read(self, path: str, position: int, size: int) -> bytes:
        return os.pread(self.get(path), size, position)

    def sync(self, paths: set[str] | None = None) -> None:
        """fsync the dirty ones among ``paths`` (all dirty ones when None)."""
        targets = self._dirty if paths is None else self._dirty & paths
        for path in list(targets):
            fd = self._fds.get(path)
            if fd is not None:
                os.fsync(fd)
            self._dirty.discard(path)

    def forget(self, path: str) -> None:
        """Close ``path`` without syncing (it is about to be deleted)."""
        fd = self._fds.pop(path, None)
        self._dirty.discard(path)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        while self._fds:
            path, fd = self._fds.popitem(last=False)
            self._close(path, fd)

    def _close(self, path: str, fd: int) -> None:
        if path in self._dirty:
            if self._fsync:
                os.fsync(fd)
            self._dirty.discard(path)
        os.close(fd)
