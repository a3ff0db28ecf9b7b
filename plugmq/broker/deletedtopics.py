"""Deleted topics: which topics an operator deleted and where each of their queues ended.

RocketMQ's ``deleteTopic`` removes a topic's config, routes, consume queues and offsets; the
commit log keeps the records until retention reclaims them. plugmq's store keeps the consume
queues as well (they go with retention), so what a deletion must record is where they ended:
per queue a *floor*, the queue's end offset when the topic was deleted. Reads start at the floor
from then on (``plugmq.broker.reads``), so a deleted topic serves nothing, and a topic created
again under the same name starts where the old one ended: no consumer of the new topic sees an
old message. Queues added later (a topic grown past the old queue count) have floor 0.

The state lives in the broker's journal ``rmq_sys_state_topics`` (plugmq.broker.journal), so a
deletion is replicated with the log, replayed at start (the topic table does not bring a deleted
topic back from what the store holds) and followed by a slave, which forgets the topic too and,
promoted, does not serve it. Operations, one JSON array each:

* ``["D", topic, {queue id: floor}]``: the topic is deleted; reads of its queues start at the floors.
* ``["C", topic, queue count]``: the topic was created again (the floors stay).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from plugmq.broker.journal import Journal
from plugmq.core.errors import CorruptRecordError

__all__ = ["DeletedTopics", "TopicChange"]

_VERSION = 1
_COMPACT_BYTES = 1 << 20

#: A followed change for the topic table: ``(topic, queue count)``, 0 when the topic was deleted.
TopicChange = tuple[str, int]


class DeletedTopics:
    """The deleted topics and the queue floors, in memory over their journal. Thread-safe; reads
    (:meth:`floor`, :meth:`deleted`) take no lock: each change replaces a whole entry."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.RLock()
        self._deleted: frozenset[str] = frozenset()
        self._floors: dict[str, dict[int, int]] = {}
        with self._lock:
            self._load()

    # ------------------------------------------------------------------------------ reads
    def deleted(self, topic: str) -> bool:
        """Whether ``topic`` was deleted and not created again since."""
        return topic in self._deleted

    def all_deleted(self) -> list[str]:
        return sorted(self._deleted)

    def floor(self, topic: str, queue_id: int) -> int:
        """The queue offset reads of the queue start at (0: the queue was never deleted)."""
        floors = self._floors.get(topic)
        return 0 if floors is None else floors.get(queue_id, 0)

    def floors(self, topic: str) -> dict[int, int]:
        return dict(self._floors.get(topic, {}))

    # ------------------------------------------------------------------------------ changes
    def record_deleted(self, topic: str, floors: Mapping[int, int]) -> int:
        """Record that ``topic`` is deleted with these queue floors; returns the log offset past
        the record. ReadOnlyBrokerError on a slave."""
        return self._commit(["D", topic, {str(q): int(f) for q, f in floors.items()}])

    def record_created(self, topic: str, queue_count: int) -> int:
        """Record that the deleted ``topic`` exists again (with ``queue_count`` queues)."""
        return self._commit(["C", topic, queue_count])

    def _commit(self, op: list[Any]) -> int:
        with self._lock:
            end = self.journal.append([json.dumps(op, separators=(",", ":")).encode()])
            self._apply(op)
            if self.journal.bytes_since_snapshot >= _COMPACT_BYTES:
                self.compact()
            return end

    def _apply(self, op: list[Any]) -> TopicChange:
        kind, topic = op[0], op[1]
        if kind == "D":
            merged = self.floors(topic)
            for queue, floor in op[2].items():
                merged[int(queue)] = max(merged.get(int(queue), 0), int(floor))
            self._floors[topic] = merged
            self._deleted = self._deleted | {topic}
            return topic, 0
        if kind == "C":
            self._deleted = self._deleted - {topic}
            return topic, int(op[2])
        raise CorruptRecordError(f"{self.journal.topic}: unknown topic operation {kind!r}")

    # ------------------------------------------------------------------------------ journal
    def _apply_record(self, record: bytes) -> TopicChange:
        return self._apply(self.journal.decode_json(record, "a topic record"))

    def _load(self) -> None:
        replay = self.journal.replay()
        self._deleted, self._floors = frozenset(), {}
        if replay.snapshot is not None:
            data = json.loads(replay.snapshot)
            if data.get("version") != _VERSION:
                raise CorruptRecordError(f"{self.journal.topic}: snapshot version {data.get('version')!r}, expected "
                                         f"{_VERSION}; it was written by another plugmq version")
            self._deleted = frozenset(data["deleted"])
            self._floors = {topic: {int(q): int(f) for q, f in floors.items()}
                            for topic, floors in data["floors"].items()}
        for record in replay.records:
            self._apply_record(record)

    def compact(self) -> None:
        """Write the deleted topics and every floor as a journal snapshot."""
        with self._lock:
            data = {"version": _VERSION, "deleted": sorted(self._deleted),
                    "floors": {t: {str(q): f for q, f in floors.items()} for t, floors in self._floors.items()}}
            self.journal.write_snapshot(json.dumps(data, separators=(",", ":")).encode())

    def follow(self) -> list[TopicChange]:
        """Apply what the master recorded since (a slave); returns the changes for its topic
        table. After a log cut the state is rebuilt as :meth:`reload` does."""
        changes: list[TopicChange] = []
        with self._lock:
            self.journal.apply_followed(lambda record: changes.append(self._apply_record(record)),
                                        lambda: changes.extend(self.reload()))
        return changes

    def reload(self) -> list[TopicChange]:
        """Rebuild from the journal (the log was cut); returns every topic deleted before or
        after as it now stands: 0 if deleted, -1 if not ("as the store holds it")."""
        with self._lock:
            before = self._deleted
            self._load()
            return [(topic, 0 if topic in self._deleted else -1) for topic in sorted(before | self._deleted)]
