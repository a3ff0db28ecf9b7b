"""Disk-full errors as every store reports them: StoreFullError naming the path and what frees space;
and how much a data dir holds on disk.

Shared by the storage plugins (which may only import the core), so that a full file system reads
the same whichever engine hit it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from plugmq.core.errors import StoreFullError

__all__ = ["DISK_FULL_ERRNOS", "allocated_bytes", "disk_full_error", "free_bytes", "is_disk_full"]

#: errno values that mean "no room": the file system is full, or the user's quota is.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

_FREES = ("space comes back when retention (clean_expired, run by the broker) removes old files or an "
          "operator frees some on that file system; writes resume by themselves then")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, or an engine error wrapping one) means the disk is full."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def allocated_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (a preallocated sparse file counts for what it holds)."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue  # removed while walking (retention)
    return total


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def disk_full_error(path: str | os.PathLike[str], what: str, *, frees: str = _FREES) -> StoreFullError:
    """The StoreFullError for a write of ``what`` under ``path`` that found no room."""
    free = free_bytes(path)
    room = f"{free} bytes free" if free is not None else "free space unknown"
    return StoreFullError(f"no space left on the file system holding {path} ({room}) for {what}; {frees}")
