"""The open-file budget: raise the soft limit at start, and name the limit when it is reached.

A broker holds descriptors for its listeners, client connections, journals and the few files a
store writes; it holds none per queue (store_mmap maps its files and closes them). Still, the
common soft limit of 1,024 is small for a server: :func:`raise_open_file_limit` lifts it to the
hard limit once, at start, and says so when what is left is low. A file that cannot be opened
because the table is full is a :class:`DescriptorLimitError` naming the limit and the fix
(shared in the kit, which storage plugins may import).
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import attrs

from plugmq.core.errors import DescriptorLimitError
from plugmq.core.logs import get_logger

__all__ = ["DescriptorBudget", "descriptor_limit_error", "fsync_dir", "is_out_of_descriptors", "open_descriptors",
           "open_or_explain", "raise_open_file_limit"]

log = get_logger(__name__)

#: errno values that mean "no descriptor to be had": this process's table, or the system's, is full.
OUT_OF_DESCRIPTORS_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
#: Below this soft limit a server is warned at start (each client connection takes a descriptor).
LOW_LIMIT = 4096

_FIX = ("raise it (ulimit -n before starting, LimitNOFILE= in a systemd unit, nofile in "
        "/etc/security/limits.conf); plugmq serve lifts the soft limit to the hard one by itself")


def is_out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` means no descriptor could be had (EMFILE / ENFILE)."""
    return isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS_ERRNOS


def open_descriptors() -> int | None:
    """How many descriptors this process holds now (Linux /proc), None where unknown."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listing the directory
    except OSError:
        return None


def descriptor_limit_error(what: str, exc: OSError | None = None) -> DescriptorLimitError:
    """The error for ``what`` (e.g. "opening /data/commitlog/000...") failing for want of a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = open_descriptors()
    which = ("the system's open-file table is full (fs.file-max)" if exc is not None and exc.errno == errno.ENFILE
             else f"the process's open-file limit is reached (RLIMIT_NOFILE soft {soft}, hard "
                  f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}"
                  f"{'' if held is None else f', {held} open'})")
    return DescriptorLimitError(f"{what} failed: {which}; nothing stored is lost and the call works again once "
                                f"descriptors are free; {_FIX}")


def open_or_explain(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open``, with a full descriptor table reported as a DescriptorLimitError."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if is_out_of_descriptors(exc):
            raise descriptor_limit_error(f"opening {path}", exc) from exc
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a created, renamed or deleted entry of directory ``path`` durable."""
    fd = open_or_explain(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.frozen
class DescriptorBudget:
    """The soft and hard open-file limits after start, and what was there before."""

    soft: int
    hard: int
    before: int

    @property
    def low(self) -> bool:
        return self.soft < LOW_LIMIT


def _ceiling(hard: int) -> int:
    """The highest soft limit that may be asked for: the hard one, or fs.nr_open when unlimited."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text().strip())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_file_limit() -> DescriptorBudget:
    """Lift the soft RLIMIT_NOFILE to the hard limit; log it, and warn when the budget stays low."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    target = _ceiling(hard)
    if before != resource.RLIM_INFINITY and before < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit", soft=before, hard=hard, error=str(exc))
    budget = DescriptorBudget(soft, hard, before)
    if budget.low:
        log.warning("open-file limit is low: every client connection, journal and store file being written takes a "
                    "descriptor; at the limit new files and connections are refused (clear errors, nothing lost). "
                    + _FIX, soft=soft, hard=hard, open=open_descriptors())
    elif soft != before:
        log.info("open-file limit raised", soft=soft, before=before)
    return budget
