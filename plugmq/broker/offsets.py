"""Consumer offsets: kept by the broker for clustering groups, per member for broadcasting.

Every committed offset lives in the broker's journal ``rmq_sys_state_offsets``
(plugmq.broker.journal): a commit is one record listing the offsets it moved, stored before the
table in memory changes; a snapshot of the whole table replaces the records once they outgrow
``_COMPACT_BYTES``. So offsets are as durable as messages, a restart replays them, and a slave
follows its master's (a promoted slave knows where every group stood). A slave's own readers
commit in memory only; a slave promoted to master writes them with its first snapshot.

Data dirs written before the journal kept one JSON file per group (``broker/offsets/<group>.json``,
``broker/offsets/broadcast/<group>/<member>.json``, admin's ``broker/dlq-resend/<group>.json``):
they are imported once, and the directories are renamed ``*.imported``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from plugmq.broker.journal import Journal
from plugmq.core.errors import CorruptRecordError, ReplicationError, StoreError
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue, SendStatus
from plugmq.core.names import validate_group

__all__ = ["BROADCASTING", "CLUSTERING", "DLQ_RESEND", "ConsumerOffsets", "OffsetStore"]

log = get_logger(__name__)

#: Owner kinds: a clustering group's table, a broadcasting member's, admin's dead-letter resend cursor.
CLUSTERING = "c"
BROADCASTING = "b"
DLQ_RESEND = "r"
_KINDS = frozenset({CLUSTERING, BROADCASTING, DLQ_RESEND})
_COMPACT_BYTES = 4 << 20
_VERSION = 1

Owner = tuple[str, str, str]  # (kind, group, member: "" unless broadcasting)


def _key(queue: MessageQueue) -> str:
    return f"{queue.topic}@{queue.broker_name}@{queue.queue_id}"


def _file_safe(member: str) -> str:
    # Client ids look like "192.168.0.1@pid"; members were file names once, and keep that spelling.
    return "".join(c if c.isalnum() or c in "_-%|" else "_" for c in member)[:127] or "_"


class ConsumerOffsets:
    """Every offset table of the broker, in memory over the journal. Thread-safe."""

    def __init__(self, journal: Journal, *, legacy_root: Path | None = None) -> None:
        self.journal = journal
        self._lock = threading.RLock()
        self._tables: dict[Owner, dict[str, int]] = {}
        self._views: dict[Owner, OffsetStore] = {}
        with self._lock:
            self._load()
            if legacy_root is not None:
                self._import_legacy(legacy_root)

    # ------------------------------------------------------------------------------ views
    def view(self, group: str, member: str | None = None, *, kind: str | None = None) -> OffsetStore:
        """The offsets of a clustering group, of one member of a broadcasting group (``member``), or
        of another owner ``kind`` (``DLQ_RESEND``)."""
        validate_group(group)
        owner: Owner = (kind or (CLUSTERING if member is None else BROADCASTING), group,
                        "" if member is None else validate_group(_file_safe(member)))
        with self._lock:
            found = self._views.get(owner)
            if found is None:
                found = self._views[owner] = OffsetStore(self, owner)
            return found

    def persist_all(self) -> None:
        """Write what every view changed and has not persisted yet (the broker is closing)."""
        with self._lock:
            views = list(self._views.values())
        for view in views:
            view.persist()

    def group_names(self) -> list[str]:
        """Clustering groups with committed offsets (sorted)."""
        with self._lock:
            return sorted({group for kind, group, _ in self._tables if kind == CLUSTERING})

    def tables(self) -> list[dict[str, int]]:
        """Copies of the clustering and broadcasting tables (what retention must keep)."""
        with self._lock:
            return [dict(t) for (kind, _, _), t in self._tables.items() if kind in (CLUSTERING, BROADCASTING)]

    def forget_group(self, group: str) -> None:
        """Delete every table of ``group`` (clustering, broadcasting members, resend cursor)."""
        validate_group(group)
        with self._lock:
            self._commit([["-", group]])

    def forget_topic(self, topic: str) -> list[str]:
        """Delete every offset on ``topic``'s queues (the topic was deleted); returns the groups
        that had some (sorted)."""
        prefix = f"{topic}@"
        with self._lock:
            groups = sorted({group for (_, group, _), table in self._tables.items()
                             if any(key.startswith(prefix) for key in table)})
            if groups:
                self._commit([["t", topic]])
            return groups

    # ------------------------------------------------------------------------------ changes
    def read(self, owner: Owner, key: str) -> int | None:
        with self._lock:
            table = self._tables.get(owner)
            return None if table is None else table.get(key)

    def entries(self, owner: Owner) -> dict[str, int]:
        with self._lock:
            return dict(self._tables.get(owner, {}))

    def write(self, owner: Owner, changes: Mapping[str, int]) -> None:
        """Record ``changes`` (key -> offset) of ``owner`` in one journal record, then apply them."""
        if not changes:
            return
        kind, group, member = owner
        with self._lock:
            end = self._commit([["=", kind, group, member, dict(changes)]])
        # Confirmed to the consumer only once replicated (committed): a failover never moves it back.
        if end is not None and self.journal.settle(end) is not SendStatus.SEND_OK:
            raise ReplicationError(f"{self.journal.topic}: the offsets of group {group!r} are recorded on this broker "
                                   "but were not replicated in time; they are written again with the next commit")

    def _commit(self, ops: list[list[Any]]) -> int | None:
        end = None
        if self.journal.writable:
            end = self.journal.append([json.dumps(ops, separators=(",", ":")).encode()])
        for op in ops:
            self._apply(op)
        if self.journal.writable and self.journal.bytes_since_snapshot >= _COMPACT_BYTES:
            self.compact()
        return end

    def _apply(self, op: list[Any]) -> None:
        if op[0] == "=":
            _, kind, group, member, changes = op
            if kind not in _KINDS:
                raise CorruptRecordError(f"{self.journal.topic}: unknown offset owner kind {kind!r}")
            self._tables.setdefault((kind, group, member), {}).update(changes)
        elif op[0] == "-":
            for owner in [o for o in self._tables if o[1] == op[1]]:
                del self._tables[owner]
        elif op[0] == "t":
            prefix = f"{op[1]}@"
            for owner, table in self._tables.items():
                self._tables[owner] = {key: offset for key, offset in table.items() if not key.startswith(prefix)}
        else:
            raise CorruptRecordError(f"{self.journal.topic}: unknown offset operation {op[0]!r}")

    # ------------------------------------------------------------------------------ journal
    def _apply_record(self, record: bytes) -> None:
        for op in self.journal.decode_json(record, "an offset record"):
            self._apply(op)

    def _load(self) -> None:
        replay = self.journal.replay()
        self._tables = {}
        if replay.snapshot is not None:
            data = json.loads(replay.snapshot)
            if data.get("version") != _VERSION:
                raise CorruptRecordError(f"{self.journal.topic}: snapshot version {data.get('version')!r}, expected "
                                         f"{_VERSION}; it was written by another plugmq version")
            for kind, group, member, table in data["tables"]:
                self._tables[(kind, group, member)] = dict(table)
        for record in replay.records:
            self._apply_record(record)

    def compact(self) -> None:
        """Write the whole table as a journal snapshot."""
        with self._lock:
            tables = [[kind, group, member, table] for (kind, group, member), table in self._tables.items()]
            self.journal.write_snapshot(json.dumps({"version": _VERSION, "tables": tables},
                                                   separators=(",", ":")).encode())

    def follow(self) -> bool:
        """Apply what the master committed since (a slave); rebuild after a cut. True if anything changed."""
        with self._lock:
            return self.journal.apply_followed(self._apply_record, self._load)

    def reload(self) -> None:
        with self._lock:
            self._load()

    def _import_legacy(self, root: Path) -> None:
        sources = [root / "offsets", root / "dlq-resend"]
        files = [(d, p) for d in sources if d.is_dir() for p in sorted(d.rglob("*.json"))]
        if not files or not self.journal.writable:
            return
        if self._tables or self.journal.position > 0:
            log.warning("offset files from before the journal ignored: the journal already holds offsets",
                        directory=str(root))
            return
        for directory, path in files:
            try:
                table = {str(k): int(v) for k, v in json.loads(path.read_text("utf-8")).items()}
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"offset file {path} is unreadable ({exc}); restore it or delete it "
                                 "(the group then starts from its consume-from position)") from exc
            relative = path.relative_to(directory).parts
            if directory.name == "dlq-resend":
                owner: Owner = (DLQ_RESEND, path.stem, "")
            elif relative[0] == "broadcast" and len(relative) == 3:
                owner = (BROADCASTING, relative[1], path.stem)
            else:
                owner = (CLUSTERING, path.stem, "")
            self._tables[owner] = table
        self.compact()
        self.journal.store.flush()
        for directory in sources:
            if directory.is_dir():
                os.replace(directory, directory.with_name(directory.name + ".imported"))
        log.info("consumer offsets imported into the journal", tables=len(self._tables), directory=str(root))

    def all_owners(self) -> Iterator[Owner]:
        with self._lock:
            yield from list(self._tables)


class OffsetStore:
    """One owner's offsets: a clustering group, one member of a broadcasting group, a cursor.

    ``update(persist=False)`` changes only this view; ``persist`` writes what changed since as one
    record (a consumer commits once per consume round, RocketMQ's periodic commit made exact).
    """

    def __init__(self, table: ConsumerOffsets, owner: Owner) -> None:
        self._table = table
        self._owner = owner
        self._lock = threading.Lock()
        self._dirty: dict[str, int] = {}

    def read(self, queue: MessageQueue) -> int | None:
        key = _key(queue)
        with self._lock:
            pending = self._dirty.get(key)
        return pending if pending is not None else self._table.read(self._owner, key)

    def entries(self, broker_name: str) -> dict[tuple[str, int], int]:
        """The committed offsets on queues of broker ``broker_name``: (topic, queue id) -> offset."""
        table = self._table.entries(self._owner)
        with self._lock:
            table.update(self._dirty)
        out: dict[tuple[str, int], int] = {}
        for key, offset in table.items():
            rest, _, queue_id = key.rpartition("@")
            topic, _, broker = rest.rpartition("@")
            if broker == broker_name and queue_id.isdigit():
                out[(topic, int(queue_id))] = offset
        return out

    def update(self, queue: MessageQueue, offset: int, *, persist: bool = True) -> None:
        """Record that everything before ``offset`` of ``queue`` was consumed."""
        key = _key(queue)
        with self._lock:
            if self._dirty.get(key, self._table.read(self._owner, key)) == offset:
                return
            self._dirty[key] = offset
        if persist:
            self.persist()

    def persist(self) -> None:
        with self._lock:
            changes, self._dirty = self._dirty, {}
        if changes:
            try:
                self._table.write(self._owner, changes)
            except BaseException:
                with self._lock:
                    self._dirty = {**changes, **self._dirty}
                raise
