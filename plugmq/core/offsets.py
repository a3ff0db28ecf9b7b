"""Consumer offsets: kept by the broker for clustering groups, per member for broadcasting.

Each offset file is rewritten atomically (new file, fsync, rename) when offsets are committed,
so a crash leaves the previous or the new table, never a torn one.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

from plugmq.core.errors import StoreError
from plugmq.core.message import MessageQueue
from plugmq.core.names import validate_group
from plugmq.core.topics import write_json_atomically

__all__ = ["OffsetStore"]


def _key(queue: MessageQueue) -> str:
    return f"{queue.topic}@{queue.broker_name}@{queue.queue_id}"


class OffsetStore:
    """Offsets of one group (clustering) or one member of a group (broadcasting), in one file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._dirty = False
        if path.exists():
            try:
                self._offsets = {str(k): int(v) for k, v in json.loads(path.read_text("utf-8")).items()}
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"offset file {path} is unreadable ({exc}); restore it or delete it "
                                 "(the group then starts from its consume-from position)") from exc

    @property
    def path(self) -> Path:
        return self._path

    @staticmethod
    def forget_group(root: Path, group: str) -> None:
        """Delete every offset file of ``group`` under ``root`` (clustering and broadcasting)."""
        validate_group(group)
        (root / "offsets" / f"{group}.json").unlink(missing_ok=True)
        shutil.rmtree(root / "offsets" / "broadcast" / group, ignore_errors=True)

    @staticmethod
    def group_names(root: Path) -> list[str]:
        """Clustering groups with an offset file under ``root`` (sorted)."""
        directory = root / "offsets"
        if not directory.is_dir():
            return []
        return sorted(path.stem for path in directory.glob("*.json"))

    @classmethod
    def for_group(cls, root: Path, group: str, member: str | None = None) -> OffsetStore:
        validate_group(group)
        if member is None:
            directory = root / "offsets"
            name = f"{group}.json"
        else:
            directory = root / "offsets" / "broadcast" / group
            name = f"{validate_group(_file_safe(member))}.json"
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory / name)

    def read(self, queue: MessageQueue) -> int | None:
        with self._lock:
            return self._offsets.get(_key(queue))

    def entries(self, broker_name: str) -> dict[tuple[str, int], int]:
        """The committed offsets on queues of broker ``broker_name``: (topic, queue id) -> offset."""
        out: dict[tuple[str, int], int] = {}
        with self._lock:
            for key, offset in self._offsets.items():
                rest, _, queue_id = key.rpartition("@")
                topic, _, broker = rest.rpartition("@")
                if broker == broker_name and queue_id.isdigit():
                    out[(topic, int(queue_id))] = offset
        return out

    def update(self, queue: MessageQueue, offset: int, *, persist: bool = True) -> None:
        """Record that everything before ``offset`` of ``queue`` was consumed."""
        with self._lock:
            if self._offsets.get(_key(queue)) == offset:
                return
            self._offsets[_key(queue)] = offset
            self._dirty = True
            if persist:
                self._persist_locked()

    def persist(self) -> None:
        with self._lock:
            if self._dirty:
                self._persist_locked()

    def _persist_locked(self) -> None:
        write_json_atomically(self._path, self._offsets)
        self._dirty = False


def _file_safe(member: str) -> str:
    # Client ids look like "192.168.0.1@pid"; map the characters a file name cannot carry.
    return "".join(c if c.isalnum() or c in "_-%|" else "_" for c in member)[:127] or "_"
