"""The broker's topic table (topic -> queue count), persisted atomically as JSON, and its queues."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from plugmq.broker.deletedtopics import DeletedTopics, TopicChange
from plugmq.core.errors import StoreError, TopicError, ValidationError
from plugmq.core.message import MessageQueue
from plugmq.core.names import validate_topic
from plugmq.kit.fdlimit import open_or_explain

__all__ = ["TopicQueues", "TopicTable", "write_json_atomically"]


def write_json_atomically(path: Path, data: object) -> None:
    """Write-new-file, fsync, rename: a crash leaves either the old or the new content.

    No descriptor to be had (a full table) is a DescriptorLimitError naming the limit."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with os.fdopen(open_or_explain(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = open_or_explain(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class TopicTable:
    """Known topics and their queue counts. Queue counts only grow (queues hold data), until an
    operator deletes the topic: ``deleted`` records that, so neither the file nor what the store
    has seen brings it back, and a later create is recorded there too (plugmq.broker.deletedtopics)."""

    def __init__(self, path: Path, seen_in_store: Mapping[str, int], deleted: DeletedTopics | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._topics: dict[str, int] = {}
        self._listeners: list[Callable[[str, int], None]] = []
        self.deleted = deleted
        if path.exists():
            try:
                self._topics = {str(k): int(v) for k, v in json.loads(path.read_text("utf-8")).items()}
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"topic table {path} is unreadable ({exc}); restore it or delete it to "
                                 "rebuild it from the store") from exc
        for topic, count in seen_in_store.items():
            if self._topics.get(topic, 0) < count:
                self._topics[topic] = count
        for topic in [t for t in self._topics if self._is_deleted(t)]:
            del self._topics[topic]  # deleted (maybe just before a crash kept the file from hearing of it)

    def _is_deleted(self, topic: str) -> bool:
        return self.deleted is not None and self.deleted.deleted(topic)

    def get(self, topic: str) -> int | None:
        return self._topics.get(topic)

    def all(self) -> dict[str, int]:
        return dict(self._topics)

    def subscribe(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(topic, queue_count)`` after a topic is created or grown, and with a
        queue count of 0 after it is deleted (in that thread)."""
        self._listeners.append(listener)

    def _tell(self, topic: str, count: int) -> None:
        for listener in list(self._listeners):
            listener(topic, count)

    def ensure(self, topic: str, queue_count: int) -> int:
        """Create ``topic`` with ``queue_count`` queues, or grow it; return its queue count.
        Creating a deleted topic again is recorded first (ReadOnlyBrokerError on a slave)."""
        validate_topic(topic)
        if not isinstance(queue_count, int) or queue_count < 1 or queue_count > 1024:
            raise ValidationError(f"queue count for topic {topic!r} must be 1..1024, got {queue_count!r}")
        with self._lock:
            current = self._topics.get(topic, 0)
            grown = queue_count > current
            if grown:  # written first: a refused write leaves the table as it was
                if current == 0 and self.deleted is not None and self.deleted.deleted(topic):
                    self.deleted.record_created(topic, queue_count)
                write_json_atomically(self._path, {**self._topics, topic: queue_count})
                self._topics[topic] = queue_count
            count = self._topics[topic]
        if grown:
            self._tell(topic, count)
        return count

    def delete(self, topic: str, floors: Mapping[int, int]) -> int:
        """Delete ``topic``: recorded (with the queue ``floors`` reads start at from now on), then
        gone from the table; returns the queue count it had. TopicError if there is no such topic."""
        if self.deleted is None:
            raise TopicError("this topic table keeps no record of deletions; topics cannot be deleted here")
        with self._lock:
            count = self._topics.get(topic)
            if count is None:
                raise TopicError(f"topic {topic!r} does not exist on this broker; nothing to delete")
            self.deleted.record_deleted(topic, floors)
            self._drop(topic)
        self._tell(topic, 0)
        return count

    def _drop(self, topic: str) -> None:
        remaining = {t: c for t, c in self._topics.items() if t != topic}
        write_json_atomically(self._path, remaining)
        self._topics = remaining

    def apply_followed(self, changes: list[TopicChange]) -> None:
        """A slave followed its master's deletions and re-creations (:meth:`DeletedTopics.follow`):
        drop a deleted topic, add one created again (-1: leave it to what the store holds)."""
        for topic, count in changes:
            with self._lock:
                if count == 0 and topic in self._topics:
                    self._drop(topic)
                elif count > self._topics.get(topic, 0):
                    write_json_atomically(self._path, {**self._topics, topic: count})
                    self._topics[topic] = count
                else:
                    continue
            self._tell(topic, count)


class TopicQueues:
    """A broker's topics as :class:`MessageQueue` lists: created on demand when the config allows."""

    def __init__(self, table: TopicTable, broker_name: str, *, default_queue_count: int,
                 auto_create: bool) -> None:
        self.table = table
        self._broker_name = broker_name
        self._default_queue_count = default_queue_count
        self._auto_create = auto_create
        self._cache: dict[str, tuple[MessageQueue, ...]] = {}

    def create(self, topic: str, queue_count: int | None = None) -> list[MessageQueue]:
        """Create (or grow) a topic; returns its queues."""
        count = self.table.ensure(topic, queue_count or self._default_queue_count)
        return list(self._queues(topic, count))

    def _queues(self, topic: str, count: int) -> tuple[MessageQueue, ...]:
        cached = self._cache.get(topic)
        if cached is None or len(cached) != count:
            cached = tuple(MessageQueue(topic, self._broker_name, i) for i in range(count))
            self._cache[topic] = cached
        return cached

    def _lookup(self, topic: str, create: bool | None) -> tuple[MessageQueue, ...]:
        count = self.table.get(topic)
        if count is not None:
            cached = self._cache.get(topic)  # _queues' hit, in line: a producer looks its topic up per send
            return cached if cached is not None and len(cached) == count else self._queues(topic, count)
        validate_topic(topic)
        if create if create is not None else self._auto_create:
            return self._queues(topic, self.table.ensure(topic, self._default_queue_count))
        raise TopicError(f"topic {topic!r} does not exist and auto_create_topic is off; "
                         f"create it with broker.create_topic({topic!r}, queue_count)")

    def queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]:
        """The queues of ``topic``; auto-creates it when allowed, else TopicError naming it."""
        return list(self._lookup(topic, create))

    def queue(self, topic: str, queue_id: int) -> MessageQueue:
        """Queue ``queue_id`` of ``topic`` (created as :meth:`queues` allows); ValidationError if out of range."""
        queues = self._lookup(topic, None)
        if not 0 <= queue_id < len(queues):
            raise ValidationError(f"queue id {queue_id} is out of range for topic {topic!r} ({len(queues)} queues)")
        return queues[queue_id]
