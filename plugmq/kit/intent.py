"""A one-slot intent file: a few integers written before a multi-step change, removed after it.

A delay plugin moving a message (``ReschedulableDelay.reschedule``) appends the message again at
its new time and then cancels the old entry: two writes, and a ``kill -9`` between them would
deliver the message twice. The plugin therefore writes an intent first (where the old entry is,
where the new one will go, the new time); a restart that finds an intent finishes or settles the
move before anything is dispatched, and a finished move removes the file.

The file is replaced atomically (write a temporary file, rename), with a CRC over the integers, so
a reader sees the previous state or the new one, never a torn one. With ``fsync`` the data and the
rename are made durable (power-cut safe); without it they survive a killed process, like the rest
of a delay plugin's files.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from plugmq.core.errors import CorruptRecordError

__all__ = ["IntentFile"]

_HEAD = struct.Struct("<II")  # field count, crc32 of the fields
_FIELD = struct.Struct("<q")


class IntentFile:
    """At most one pending intent of ``fields`` signed 64-bit integers, at ``path``."""

    def __init__(self, path: Path, fields: int, *, fsync: bool) -> None:
        self._path = path
        self._tmp = path.with_name(path.name + ".tmp")
        self._fields = fields
        self._fsync = fsync

    def read(self) -> tuple[int, ...] | None:
        """The pending intent, or None. CorruptRecordError for a file this class did not write
        (an atomic replace never leaves a torn one)."""
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _HEAD.size + self._fields * _FIELD.size:
            raise CorruptRecordError(f"intent file {self._path} holds {len(raw)} bytes, not the "
                                     f"{_HEAD.size + self._fields * _FIELD.size} of an intent; remove it "
                                     "only after checking what the interrupted change was")
        count, crc = _HEAD.unpack_from(raw)
        body = raw[_HEAD.size:]
        if count != self._fields or crc != zlib.crc32(body):
            raise CorruptRecordError(f"intent file {self._path} fails its CRC check")
        return tuple(value for (value,) in _FIELD.iter_unpack(body))

    def write(self, values: tuple[int, ...]) -> None:
        """Record an intent (replacing any other)."""
        if len(values) != self._fields:
            raise ValueError(f"an intent of {self._path.name} has {self._fields} fields, got {len(values)}")
        body = b"".join(_FIELD.pack(v) for v in values)
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _HEAD.pack(self._fields, zlib.crc32(body)) + body)
            if self._fsync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(self._tmp, self._path)
        self._sync_dir()

    def clear(self) -> None:
        """The change is complete: no intent is pending any more."""
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            return
        self._sync_dir()

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
