"""Durable pop-consumption state: per (group, topic, queue) lane, a cursor and the in-flight messages.

Everything a consumer group did is in ``<data_dir>/broker/pop/``: a snapshot (``pop-snapshot.json``,
replaced atomically) and the append-only log of changes made since (``pop-<generation>.log``,
one JSON array per line). Data dirs written before pop moved into the core kept these files in
``<data_dir>/server/``; they are moved over (renames only, crash-safe) the first time the state opens. A change is written to the log before it takes effect in memory, so a
restart replays to the same state; a torn last line (a crash mid-write) is cut off. A lost line
can only make a message be delivered again (at-least-once), never lose one: messages live in
the store, the log only says which ones a group is done with.

Operations (``apply`` runs the same code live and on replay):

* ``["L", lane, group, topic, queue, next]``: a lane starts at queue offset ``next``.
* ``["P", lane, next, [[offset, attempt, until_ms, seq, commit_log_offset, size, message_group], ...]]``:
  messages handed out (new ones and redeliveries), the cursor moved to ``next``.
* ``["A", lane, [offset, ...]]``: done with these (acked, or moved to the DLQ).
* ``["C", lane, offset, until_ms, seq]``: a message's invisible time changed (new receipt handle).
* ``["D", lane]``: the lane is gone (its group was deleted, or its topic no longer exists).
* ``["R", lane, next]``: an operator reset the group's position (``plugmq admin reset-offset``):
  the cursor moves to ``next`` (back or forward) and the in-flight messages are forgotten.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.errors import ClientError, CorruptRecordError
from plugmq.core.logs import get_logger

__all__ = ["Inflight", "Lane", "PopState", "adopt_legacy_state"]

log = get_logger(__name__)

_SNAPSHOT = "pop-snapshot.json"
_VERSION = 1
_STAGING_SUFFIX = ".adopting"


@attrs.define(slots=True)
class Inflight:
    """A message handed out and not yet done: its delivery attempt, invisible deadline, handle seq."""

    offset: int
    attempt: int
    until_ms: int
    seq: int
    commit_log_offset: int
    size: int
    message_group: str | None

    def row(self) -> list[Any]:
        return [self.offset, self.attempt, self.until_ms, self.seq, self.commit_log_offset, self.size,
                self.message_group]


@attrs.define(slots=True)
class Lane:
    """One consumer group's progress on one queue: offsets below ``next_offset`` and not in
    ``inflight`` are done for the group."""

    id: int
    group: str
    topic: str
    queue_id: int
    next_offset: int
    inflight: dict[int, Inflight] = attrs.field(factory=dict)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _state_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted([*directory.glob("pop-*.log"), *directory.glob(_SNAPSHOT)])


def adopt_legacy_state(directory: Path, legacy: Path) -> bool:
    """Move pop state written under ``legacy`` (``<data_dir>/server``) into ``directory``.

    Only renames: files go into ``<directory>.adopting`` one by one, which is renamed to
    ``directory`` last. A crash at any point leaves every file either still in ``legacy`` or in the
    staging directory, and the next call finishes the move. Returns whether anything was moved.
    """
    if directory.exists():
        return False
    staging = directory.with_name(directory.name + _STAGING_SUFFIX)
    files = _state_files(legacy)
    if not files and not staging.exists():
        return False
    staging.mkdir(parents=True, exist_ok=True)
    for file in files:
        os.replace(file, staging / file.name)
    _fsync_dir(staging)
    if legacy.is_dir():
        _fsync_dir(legacy)
    os.replace(staging, directory)
    _fsync_dir(directory.parent)
    log.info("pop state moved to the broker's directory", source=str(legacy), directory=str(directory),
             files=len(files))
    return True


class PopState:
    """The lanes in memory plus their log. Callers hold ``lock`` around read-modify-commit."""

    def __init__(self, directory: Path, *, fsync: bool = False, compact_bytes: int = 8 << 20) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._fsync = fsync
        self._compact_bytes = compact_bytes
        self.lanes: dict[tuple[str, str, int], Lane] = {}
        self.by_id: dict[int, Lane] = {}
        self.seq = 0
        self._generation = 0
        self._fd = -1
        self._size = 0
        self._closed = False
        self._load()

    # ------------------------------------------------------------------------------ live changes
    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def lane(self, group: str, topic: str, queue_id: int, start: Callable[[], int]) -> Lane:
        """The lane of (group, topic, queue), created at offset ``start()`` on first use."""
        found = self.lanes.get((group, topic, queue_id))
        if found is not None:
            return found
        lane_id = max(self.by_id, default=0) + 1
        self.commit([["L", lane_id, group, topic, queue_id, start()]])
        return self.by_id[lane_id]

    def commit(self, ops: list[list[Any]]) -> None:
        """Log ``ops`` (one write), then apply them."""
        if not ops:
            return
        if self._closed:
            raise ClientError(f"pop state in {self.directory} is closed; the broker is closing")
        data = "".join(json.dumps(op, separators=(",", ":")) + "\n" for op in ops).encode()
        written = os.write(self._fd, data)
        while written < len(data):
            written += os.write(self._fd, data[written:])
        if self._fsync:
            os.fdatasync(self._fd)
        self._size += len(data)
        for op in ops:
            self.apply(op)
        if self._size >= self._compact_bytes:
            self.compact()

    def apply(self, op: list[Any]) -> None:
        kind = op[0]
        if kind == "L":
            _, lane_id, group, topic, queue_id, start = op
            lane = Lane(lane_id, group, topic, queue_id, start)
            self.lanes[(group, topic, queue_id)] = lane
            self.by_id[lane_id] = lane
            return
        lane = self.by_id[op[1]]
        if kind == "P":
            lane.next_offset = max(lane.next_offset, op[2])
            for row in op[3]:
                entry = Inflight(*row)
                lane.inflight[entry.offset] = entry
                self.seq = max(self.seq, entry.seq)
        elif kind == "A":
            for offset in op[2]:
                lane.inflight.pop(offset, None)
        elif kind == "C":
            changed = lane.inflight.get(op[2])
            if changed is not None:
                changed.until_ms, changed.seq = op[3], op[4]
            self.seq = max(self.seq, op[4])
        elif kind == "R":
            lane.next_offset = op[2]
            lane.inflight.clear()
        elif kind == "D":
            del self.by_id[lane.id]
            del self.lanes[(lane.group, lane.topic, lane.queue_id)]
        else:
            raise CorruptRecordError(f"unknown pop-state operation {kind!r}")

    # ------------------------------------------------------------------------------ files
    def _log_path(self, generation: int) -> Path:
        return self.directory / f"pop-{generation}.log"

    def _load(self) -> None:
        snapshot = self.directory / _SNAPSHOT
        if snapshot.exists():
            data = json.loads(snapshot.read_text(encoding="utf-8"))
            if data.get("version") != _VERSION:
                raise CorruptRecordError(f"{snapshot} has version {data.get('version')!r}, expected {_VERSION}; "
                                         "it was written by another plugmq version")
            self._generation = data["generation"]
            self.seq = data["seq"]
            for lane_id, group, topic, queue_id, next_offset, rows in data["lanes"]:
                self.apply(["L", lane_id, group, topic, queue_id, next_offset])
                self.apply(["P", lane_id, next_offset, rows])
        path = self._log_path(self._generation)
        replayed = self._replay(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        for stale in self.directory.glob("pop-*.log"):
            if stale != path:
                stale.unlink()  # an older generation the snapshot already holds
        log.info("pop state loaded", lanes=len(self.lanes), inflight=self.inflight_count(), replayed=replayed,
                 directory=str(self.directory))

    def _replay(self, path: Path) -> int:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        count = 0
        position = 0
        for line in raw.splitlines(keepends=True):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no line end")
                op = json.loads(line)
            except ValueError as exc:
                if position + len(line) == len(raw):
                    log.warning("pop-state log ends in a torn write; cut off", path=str(path), at=position)
                    os.truncate(path, position)
                    break
                raise CorruptRecordError(f"{path}: unreadable record at byte {position} ({exc}); the log is damaged "
                                         f"beyond a torn tail: move the directory {self.directory} aside to reset "
                                         "pop consumers' progress (messages stay in the store)") from exc
            self.apply(op)
            position += len(line)
            count += 1
        return count

    def compact(self) -> None:
        """Snapshot the state under a new generation, then drop the old log."""
        generation = self._generation + 1
        lanes = [[lane.id, lane.group, lane.topic, lane.queue_id, lane.next_offset,
                  [entry.row() for entry in lane.inflight.values()]] for lane in self.by_id.values()]
        data = json.dumps({"version": _VERSION, "generation": generation, "seq": self.seq, "lanes": lanes})
        target = self.directory / _SNAPSHOT
        temporary = target.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
        _fsync_dir(self.directory)
        old = self._generation
        os.close(self._fd)
        self._generation = generation
        self._fd = os.open(self._log_path(generation), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._size = 0
        self._log_path(old).unlink(missing_ok=True)

    def inflight_count(self) -> int:
        return sum(len(lane.inflight) for lane in self.by_id.values())

    def drop_lanes(self, doomed: Iterable[Lane]) -> int:
        """Forget ``doomed`` lanes for good (in-flight messages included); returns how many."""
        ops: list[list[Any]] = [["D", lane.id] for lane in doomed]
        self.commit(ops)
        return len(ops)

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
