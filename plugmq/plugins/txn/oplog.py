"""The op log: every decision, counted check and finished effect of the transaction service.

RocketMQ keeps decisions as messages of an op topic and matches them against the half queue on
every check pass; here they are fixed-size records in the plugin's own file, replayed once at
start, so "is this transaction settled?" is a set lookup and a restart knows every decision::

    1 kind | 3 pad | 4 crc32(kind + half + value) | 8 half queue offset | 8 value   (24 bytes)

    C  commit decided    value = max offset of the real queue when decided (recovery looks there)
    R  rollback decided  terminal
    T  discard decided   value = max offset of the discard queue when decided
    D  done              the delivery of a C or T reached the store; terminal
    K  check counted     value = checks made so far; written before the check is made
    L  lost              the half message is gone from the store (retention); terminal
    W  watermark         every half offset below ``half`` is terminal (written by compaction)

A decision is written (and fsynced) before it takes effect; a D only after the store took the
delivery, so a C or T without a D is the one state recovery has to settle by looking.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

import attrs

from plugmq.core.logs import get_logger

__all__ = ["CHECKED", "COMMIT", "DISCARD", "DONE", "LOST", "ROLLBACK", "WATERMARK", "OpLog", "OpState", "record"]

log = get_logger(__name__)

COMMIT = ord("C")
ROLLBACK = ord("R")
DISCARD = ord("T")
DONE = ord("D")
CHECKED = ord("K")
LOST = ord("L")
WATERMARK = ord("W")
_KINDS = frozenset({COMMIT, ROLLBACK, DISCARD, DONE, CHECKED, LOST, WATERMARK})
_TERMINAL = frozenset({ROLLBACK, DONE, LOST})
_RECORD = struct.Struct(">B3xIqq")
_CRC_PART = struct.Struct(">Bqq")
RECORD_SIZE = _RECORD.size


def record(kind: int, half: int, value: int = 0) -> bytes:
    return _RECORD.pack(kind, zlib.crc32(_CRC_PART.pack(kind, half, value)), half, value)


@attrs.define
class OpState:
    """What the op log says. Offsets below ``watermark`` are terminal and not listed."""

    watermark: int = 0
    decided: dict[int, tuple[int, int]] = attrs.field(factory=dict)  # half -> (C or T, mark)
    terminal: set[int] = attrs.field(factory=set)
    checks: dict[int, int] = attrs.field(factory=dict)
    records: int = 0

    def apply(self, kind: int, half: int, value: int) -> None:
        self.records += 1
        if kind == WATERMARK:
            self.watermark = max(self.watermark, half)
            return
        if half < self.watermark:
            return
        if kind in _TERMINAL:
            self.terminal.add(half)
            self.decided.pop(half, None)
            self.checks.pop(half, None)
        elif kind == CHECKED:
            if half not in self.terminal:
                self.checks[half] = max(self.checks.get(half, 0), value)
        elif half not in self.terminal:  # C or T: the first decision wins, a later one is ignored
            self.decided.setdefault(half, (kind, value))

    def prune(self) -> None:
        low = self.watermark
        self.terminal = {h for h in self.terminal if h >= low}
        self.decided = {h: d for h, d in self.decided.items() if h >= low}
        self.checks = {h: c for h, c in self.checks.items() if h >= low}


class OpLog:
    """Append-only file of op records; ``rewrite`` replaces it atomically (compaction)."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self._fd = -1
        self.size = 0
        self._synced = 0
        self._sync_lock = threading.Lock()

    def replay(self) -> OpState:
        """Read every record, cutting a torn or corrupt tail (only the last write can be torn)."""
        state = OpState()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        pos = 0
        while pos + RECORD_SIZE <= len(data):
            kind, crc, half, value = _RECORD.unpack_from(data, pos)
            if kind not in _KINDS or zlib.crc32(_CRC_PART.pack(kind, half, value)) != crc:
                break
            state.apply(kind, half, value)
            pos += RECORD_SIZE
        if pos != len(data):
            log.warning("transaction op log tail cut", path=str(self.path), valid=pos, size=len(data))
            with self.path.open("r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        state.prune()
        self._open()
        self.size = self._synced = pos
        return state

    def _open(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if not existed and self._fsync:
            _fsync_dir(self.path.parent)

    def append(self, data: bytes) -> int:
        """Append records (the caller serialises appends); returns the end position to sync to."""
        _write_all(self._fd, data)
        self.size += len(data)
        return self.size

    def sync_to(self, position: int) -> None:
        """Make everything up to ``position`` durable (with the fsync option). Group commit: one
        fdatasync covers every append made before it started, whoever made them."""
        if not self._fsync or self._synced >= position:
            return
        with self._sync_lock:
            if self._synced >= position or self._fd < 0:
                return
            target = self.size
            _datasync(self._fd)
            self._synced = target

    def sync(self) -> None:
        self.sync_to(self.size)

    def rewrite(self, records: Iterable[bytes]) -> None:
        """Replace the log with ``records`` so a restart sees the old or the new log, never a mix."""
        data = b"".join(records)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with self._sync_lock:  # no group-commit fsync may run on the descriptor being replaced
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
            self._open()
            self.size = self._synced = len(data)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            with self._sync_lock:
                os.close(self._fd)
                self._fd = -1


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_datasync = getattr(os, "fdatasync", os.fsync)
