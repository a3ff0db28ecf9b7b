"""Per-level dispatch offsets (RocketMQ's ``delayOffset.json``), written atomically.

RocketMQ persists this table every 10 s, so a restart re-delivers up to 10 s of every level.
Here it is rewritten after every delivery batch: write a temporary file, fsync it, rename it over
the old one, fsync the directory. A crash leaves either the old or the new table, never a torn
one; what was delivered after the last persist is settled at start-up by ``was_delivered``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from plugmq.core import DelayError

__all__ = ["OffsetTable"]

_VERSION = 1


class OffsetTable:
    """Queue id -> next consume-queue offset to deliver, for the schedule topic's queues."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self.offsets: dict[int, int] = {}
        self.persists = 0
        if path.exists():
            try:
                data = json.loads(path.read_text("utf-8"))
                if data.get("version") != _VERSION:
                    raise ValueError(f"version {data.get('version')!r}, expected {_VERSION}")
                self.offsets = {int(q): int(o) for q, o in data["offsets"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise DelayError(
                    f"delay_level offset file {path} is unreadable ({exc}); it is rewritten atomically, so this "
                    f"is outside damage: restore it from a backup, or delete it to re-deliver every level from 0"
                ) from exc
        # A temp file left by a crash mid-persist is garbage: the rename never happened.
        self._tmp = path.with_name(path.name + ".tmp")
        self._tmp.unlink(missing_ok=True)

    def get(self, queue_id: int) -> int:
        return self.offsets.get(queue_id, 0)

    def set(self, queue_id: int, offset: int) -> None:
        self.offsets[queue_id] = offset

    def persist(self) -> None:
        body = json.dumps({"version": _VERSION, "offsets": {str(q): o for q, o in sorted(self.offsets.items())}})
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body.encode("utf-8"))
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self._tmp, self.path)
        if self._fsync:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.persists += 1
