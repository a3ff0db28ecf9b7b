"""One fixed-size file mapped into memory (RocketMQ's MappedFile), with reference counting.

Files are created sparse, but every byte gets its blocks (posix_fallocate, :meth:`reserve`)
before it is written through the mapping: a store on a full file system gets a StoreFullError
before a write, never a SIGBUS during one - and a 1 GiB segment costs disk only as it fills.

Readers ``acquire()`` a file before touching its mapping and ``release()`` it after; retention calls
``destroy()``, which unlinks the file at once but unmaps it only when the last reader has let go,
so a read in progress never faults on a closed mapping.

A mapped file holds no descriptor: a mapping outlives the descriptor it was made with, and the
few calls that need one (posix_fallocate, SEEK_DATA) open the file for the call. Python's mmap
keeps a duplicate of the descriptor for the mapping's life before 3.13 (``trackfd=False`` there),
so the mapping is placed over an anonymous one of the same size (``MAP_FIXED``) instead: a broker
with 10,000 queues needs no descriptor for them, where it needed two per consume-queue file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plugmq.core import StoreError
from plugmq.core.logs import get_logger
from plugmq.kit.diskspace import disk_full_error, is_disk_full
from plugmq.kit.fdlimit import descriptor_limit_error, fsync_dir, is_out_of_descriptors, open_or_explain

__all__ = ["MappedFile", "fsync_dir", "offset_name"]

log = get_logger(__name__)

_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)


_libc = ctypes.CDLL(None, use_errno=True)  # its calls release the GIL
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
_libc.msync.restype = ctypes.c_int
_libc.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MAP_FAILED = ctypes.c_void_p(-1).value
_MS_SYNC = 4  # Linux


def _address(mm: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # an exported buffer would keep the mapping from closing


def _map(fd: int, size: int) -> tuple[mmap.mmap, int]:
    """Map ``size`` bytes of ``fd`` shared read-write, keeping no descriptor; (mapping, address)."""
    if sys.version_info >= (3, 13):
        mm = mmap.mmap(fd, size, trackfd=False)  # type: ignore[call-arg, unused-ignore]
        return mm, _address(mm)
    mm = mmap.mmap(-1, size)  # anonymous: an address range of the right size that holds no descriptor
    address = _address(mm)
    placed = _libc.mmap(address, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | 0x10, fd, 0)  # MAP_FIXED
    if placed != address:
        code = ctypes.get_errno()
        mm.close()
        raise OSError(code, f"mmap of the file over its address range failed: {os.strerror(code)}")
    return mm, address


def _file_error(exc: OSError, path: Path, size: int) -> StoreError:
    if is_out_of_descriptors(exc):
        return descriptor_limit_error(f"creating or sizing {path}", exc)
    if is_disk_full(exc):
        return disk_full_error(path.parent, f"a new {size}-byte file {path.name}")
    return StoreError(f"cannot create or size {path} ({size} bytes): {exc.strerror or exc}")


def offset_name(offset: int) -> str:
    """RocketMQ's file name: the start offset as 20 decimal digits."""
    return f"{offset:020d}"


class MappedFile:
    """A file of ``size`` bytes starting at logical offset ``start``, mapped read-write.

    ``allocated``: the first that many bytes have blocks on disk (for an opened file: 0 until
    :meth:`reserve` says otherwise). Every writer reserves the bytes it will write before writing
    them; reading a sparse part only sees zeros and costs nothing."""

    __slots__ = ("_address", "_available", "_lock", "_refs", "allocated", "end", "mm", "path", "size", "start")

    def __init__(self, path: Path, start: int, fd: int, size: int) -> None:
        """Map ``size`` bytes of the open ``fd``; the caller closes ``fd`` (the mapping does not need it)."""
        self.path = path
        self.start = start
        self.size = size
        self.end = start + size
        self.mm, self._address = _map(fd, size)
        self.allocated = 0
        self._refs = 1  # the owner's reference, dropped by destroy()/close()
        self._available = True
        self._lock = threading.Lock()

    # -- creation ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, start: int, size: int, *, reserve: int | None = None, warm: bool = False,
               sync_dir: bool = False) -> MappedFile:
        """Create a zero-filled file atomically (written under a temporary name, then renamed),
        so a crash never leaves a short file under a real name.

        Its first ``reserve`` bytes (all of it by default) get their blocks now (posix_fallocate):
        no room is a StoreFullError here, before anything is written. ``warm`` allocates all of
        it and faults the pages in, so the first writes do not page-fault (RocketMQ's
        warmMappedFile)."""
        tmp = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise _file_error(exc, path, size) from exc
        try:
            first = size if reserve is None or warm else min(size, reserve)
            try:
                os.ftruncate(fd, size)
                if first:
                    os.posix_fallocate(fd, 0, first)
            except OSError as exc:
                raise _file_error(exc, path, size) from exc
            made = cls(path, start, fd, size)
            made.allocated = first
        except BaseException:
            os.close(fd)
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
            if sync_dir:
                fsync_dir(path.parent)
        except BaseException:
            made.close()
            raise
        if warm:
            made.warm()
        return made

    @classmethod
    def open(cls, path: Path, start: int, *, size: int | None = None) -> MappedFile:
        """Map an existing file; with ``size``, a shorter file (a truncated one) is first grown
        back to it (the new part reads as zeros; it is allocated when written)."""
        fd = open_or_explain(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if size is not None and actual < size:
                os.ftruncate(fd, size)
                actual = size
            if actual <= 0:
                raise StoreError(f"{path} is empty; a store file must have its full size (delete it to rebuild)")
            return cls(path, start, fd, actual)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _descriptor(self) -> Iterator[int]:
        """The file opened for one call that needs a descriptor (the mapping keeps none)."""
        fd = open_or_explain(self.path, os.O_RDWR)
        try:
            yield fd
        finally:
            os.close(fd)

    def reserve(self, upto: int, chunk: int = 0) -> None:
        """Make sure bytes ``[0, upto)`` have blocks on disk before anyone writes them, reserving
        ``chunk`` more while at it (fewer calls). A write into a sparse page on a full file
        system kills the process with SIGBUS; this raises StoreFullError instead."""
        if upto <= self.allocated:
            return
        target = min(self.size, max(upto, self.allocated + chunk))
        try:
            with self._descriptor() as fd:
                os.posix_fallocate(fd, self.allocated, target - self.allocated)
        except OSError as exc:
            if target > upto:  # the chunk may not fit where the write itself does
                self.reserve(upto)
                return
            raise _file_error(exc, self.path, self.size) from exc
        self.allocated = target

    def warm(self) -> None:
        """Allocate everything and fault every page in for writing (one write per page)."""
        self.reserve(self.size)
        mm = self.mm
        for pos in range(0, self.size, mmap.PAGESIZE):
            mm[pos] = mm[pos]

    # -- reference counting -------------------------------------------------------------------

    def acquire(self) -> bool:
        """Take a reader reference; False once the file is being destroyed."""
        with self._lock:
            if not self._available:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            self._unmap()

    @property
    def available(self) -> bool:
        return self._available

    def _unmap(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a stray export; the GC closes it with the last reference
            log.warning("mapped file still exported at unmap", path=str(self.path))

    def _drop_owner(self) -> bool:
        with self._lock:
            if not self._available:
                return False
            self._available = False
        self.release()
        return True

    def close(self) -> None:
        """Release the owner's reference (unmapped when the last reader is done)."""
        self._drop_owner()

    def destroy(self) -> None:
        """Delete the file now; its mapping goes away with the last reader."""
        if self._drop_owner():
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    # -- I/O ----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write dirty pages back and wait for them: msync(MS_SYNC), which Linux carries out as an
        fdatasync of the file's range. Called through ctypes, it releases the GIL meanwhile (mmap.flush
        does not) and needs no descriptor, so a full descriptor table never stops a flush."""
        if _libc.msync(self._address, self.size, _MS_SYNC) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"msync of {self.path} failed: {os.strerror(code)}")

    def data_ranges(self, begin: int, end: int) -> list[tuple[int, int]]:
        """The parts of [begin, end) that hold allocated data; holes of a sparse file are skipped,
        so checking the empty tail of a 1 GiB segment costs no page faults."""
        ranges = []
        pos = begin
        try:
            with self._descriptor() as fd:
                while pos < end:
                    try:
                        data = os.lseek(fd, pos, os.SEEK_DATA)
                    except OSError as exc:
                        if exc.errno == errno.ENXIO:  # nothing but holes from here on
                            break
                        raise
                    if data >= end:
                        break
                    hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
                    ranges.append((data, hole))
                    pos = hole
        except (OSError, StoreError):  # no SEEK_DATA, the file gone (retention), no descriptor: look at everything
            return [(begin, end)]
        return ranges

    def data_end(self) -> int:
        """Where the file's last stretch of data ends (page-granular); past it there are only
        holes. Readers that scan for the end stop here: reading a hole through a tmpfs mapping
        allocates a page, which on a full file system is a SIGBUS."""
        ranges = self.data_ranges(0, self.size)
        return ranges[-1][1] if ranges else 0

    def is_zero(self, begin: int, end: int | None = None) -> bool:
        end = self.size if end is None else min(end, self.size)
        mm = self.mm
        for first, last in self.data_ranges(begin, end):
            for pos in range(first, last, _ZERO_CHUNK):
                if _holds_data(mm, pos, min(pos + _ZERO_CHUNK, last)):
                    return False
        return True

    def zero(self, begin: int, end: int | None = None) -> int:
        """Zero [begin, end); only chunks holding data are written, so sparse regions stay sparse.
        Returns the number of bytes rewritten."""
        end = self.size if end is None else min(end, self.size)
        mm = self.mm
        written = 0
        for first, last in self.data_ranges(begin, end):
            for pos in range(first, last, _ZERO_CHUNK):
                stop = min(pos + _ZERO_CHUNK, last)
                if _holds_data(mm, pos, stop):
                    mm[pos:stop] = _ZEROS[: stop - pos]
                    written += stop - pos
        return written

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, start={self.start}, size={self.size})"


def _holds_data(mm: mmap.mmap, begin: int, end: int) -> bool:
    """Whether ``mm[begin:end]`` holds a non-zero byte: looked at in place (no copy), at memory
    speed; recovery checks the whole unwritten rest of the newest segment this way."""
    view = np.frombuffer(mm, dtype=np.uint8, count=end - begin, offset=begin)
    try:
        return bool(np.count_nonzero(view))
    finally:
        del view  # an exported buffer would keep the mapping from closing
