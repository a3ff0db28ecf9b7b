"""The broker's topic table (topic -> queue count), persisted atomically as JSON."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from plugmq.core.errors import StoreError, ValidationError
from plugmq.core.names import validate_topic

__all__ = ["TopicTable", "write_json_atomically"]


def write_json_atomically(path: Path, data: object) -> None:
    """Write-new-file, fsync, rename: a crash leaves either the old or the new content."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class TopicTable:
    """Known topics and their queue counts. Queue counts only grow (queues hold data)."""

    def __init__(self, path: Path, seen_in_store: Mapping[str, int]) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._topics: dict[str, int] = {}
        self._listeners: list[Callable[[str, int], None]] = []
        if path.exists():
            try:
                self._topics = {str(k): int(v) for k, v in json.loads(path.read_text("utf-8")).items()}
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"topic table {path} is unreadable ({exc}); restore it or delete it to "
                                 "rebuild it from the store") from exc
        for topic, count in seen_in_store.items():
            if self._topics.get(topic, 0) < count:
                self._topics[topic] = count

    def get(self, topic: str) -> int | None:
        return self._topics.get(topic)

    def all(self) -> dict[str, int]:
        return dict(self._topics)

    def subscribe(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(topic, queue_count)`` after a topic is created or grown (in that thread)."""
        self._listeners.append(listener)

    def ensure(self, topic: str, queue_count: int) -> int:
        """Create ``topic`` with ``queue_count`` queues, or grow it; return its queue count."""
        validate_topic(topic)
        if not isinstance(queue_count, int) or queue_count < 1 or queue_count > 1024:
            raise ValidationError(f"queue count for topic {topic!r} must be 1..1024, got {queue_count!r}")
        with self._lock:
            current = self._topics.get(topic, 0)
            grown = queue_count > current
            if grown:
                self._topics[topic] = queue_count
                write_json_atomically(self._path, self._topics)
            count = self._topics[topic]
        if grown:
            for listener in list(self._listeners):
                listener(topic, count)
        return count
