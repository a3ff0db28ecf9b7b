"""Durable pop-consumption state: per (group, topic, queue) lane, a cursor and the in-flight messages.

The state lives in the broker's journal ``rmq_sys_state_pop`` (plugmq.broker.journal): every change
is a record (one JSON array per operation, one line each) stored before it takes effect in memory,
and a snapshot replaces the records once they outgrow ``compact_bytes``. A restart replays to the
same state; a slave follows its master's records, so a promoted slave knows every group's
progress. A lost record (a power cut with async flush) can only make a message be delivered again
(at-least-once), never lose one: messages live in the store, the state only says which ones a group
is done with.

A slave's journal is read-only: consumers that read from a slave change its state in memory only
(lanes it creates get negative ids, so they never collide with the master's), and a slave promoted
to master writes the state it holds, its own readers' progress included, as its first snapshot.
A returning master learns that progress too: the slave hands the lanes its readers changed over
(:meth:`PopState.handover`) as it connects, and the master moves its own lanes forward to them.

Data dirs written before the journal kept a snapshot (``pop-snapshot.json``) and a log
(``pop-<generation>.log``) in ``<data_dir>/broker/pop/`` (earlier still in ``<data_dir>/server/``):
they are imported into the journal once, and the directory is renamed ``pop.imported``.

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

import heapq
import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from plugmq.broker.journal import Journal
from plugmq.core.contracts import ConsumerHandover
from plugmq.core.errors import ClientError, CorruptRecordError, ReplicationError
from plugmq.core.logs import get_logger
from plugmq.core.message import SendStatus
from plugmq.kit.fdlimit import fsync_dir

__all__ = ["Inflight", "Lane", "PopState", "adopt_legacy_state"]

log = get_logger(__name__)

_SNAPSHOT = "pop-snapshot.json"
_VERSION = 1
_STAGING_SUFFIX = ".adopting"
_STALE_SLACK = 1024  # stale deadline items a lane keeps before its heap is rebuilt from what is in flight


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
    ``inflight`` are done for the group.

    Two heaps find the messages whose invisible time ran out without looking at every message in
    flight (a receive costs the same with 10 or 100,000 of them): ``deadlines`` holds
    ``(until_ms, offset, seq)`` of every deadline set, ``passed`` ``(offset, seq)`` of those that
    ran out. An item whose ``seq`` is no longer its message's (acked, delivered again, its
    invisible time changed) is stale and skipped; both heaps are derived, never stored."""

    id: int
    group: str
    topic: str
    queue_id: int
    next_offset: int
    inflight: dict[int, Inflight] = attrs.field(factory=dict)
    deadlines: list[tuple[int, int, int]] = attrs.field(factory=list, eq=False, repr=False)
    passed: list[tuple[int, int]] = attrs.field(factory=list, eq=False, repr=False)

    def hold(self, entry: Inflight) -> None:
        """``entry`` is in flight (handed out, or its invisible time changed) until its deadline."""
        self.inflight[entry.offset] = entry
        deadlines = self.deadlines
        heapq.heappush(deadlines, (entry.until_ms, entry.offset, entry.seq))
        if len(deadlines) > 2 * len(self.inflight) + _STALE_SLACK:  # mostly acked ones: rebuilt
            self.deadlines = [(e.until_ms, e.offset, e.seq) for e in self.inflight.values()]
            heapq.heapify(self.deadlines)
            self.passed = []  # each message still in flight has its deadline in the new heap

    def forget_all(self) -> None:
        self.inflight.clear()
        self.deadlines.clear()
        self.passed.clear()

    def _current(self, offset: int, seq: int) -> Inflight | None:
        entry = self.inflight.get(offset)
        return entry if entry is not None and entry.seq == seq else None

    def _run_out(self, now: int) -> None:
        """Move the deadlines passed by ``now`` to ``passed``."""
        deadlines, passed = self.deadlines, self.passed
        while deadlines and deadlines[0][0] <= now:
            _, offset, seq = heapq.heappop(deadlines)
            if self._current(offset, seq) is not None:
                heapq.heappush(passed, (offset, seq))

    def next_deadline(self, now: int) -> int | None:
        """The earliest deadline of a message in flight that is still ahead of ``now``."""
        self._run_out(now)
        deadlines = self.deadlines
        while deadlines and self._current(deadlines[0][1], deadlines[0][2]) is None:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def timed_out(self, now: int) -> list[Inflight]:
        """Every message whose invisible time ran out by ``now``, in queue order."""
        self._run_out(now)
        current = [entry for offset, seq in self.passed if (entry := self._current(offset, seq)) is not None]
        return sorted(current, key=lambda entry: entry.offset)

    def first_timed_out(self, now: int, want: int, skip: Callable[[Inflight], bool]
                        ) -> tuple[list[Inflight], list[Inflight]]:
        """The first ``want`` messages in queue order whose invisible time ran out by ``now`` and
        that ``skip`` does not pass over, and those it passed over on the way. Both stay timed out
        until an operation changes them (the heap keeps them)."""
        self._run_out(now)
        passed = self.passed
        taken: list[Inflight] = []
        skipped: list[Inflight] = []
        while passed and len(taken) < want:
            offset, seq = heapq.heappop(passed)
            entry = self._current(offset, seq)
            if entry is not None:
                (skipped if skip(entry) else taken).append(entry)
        for entry in (*taken, *skipped):
            heapq.heappush(passed, (entry.offset, entry.seq))
        return taken, skipped


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
    fsync_dir(staging)
    if legacy.is_dir():
        fsync_dir(legacy)
    os.replace(staging, directory)
    fsync_dir(directory.parent)
    log.info("pop state moved to the broker's directory", source=str(legacy), directory=str(directory),
             files=len(files))
    return True


class _Lanes:
    """Lanes by key and by id, and the highest receipt-handle sequence seen."""

    def __init__(self) -> None:
        self.lanes: dict[tuple[str, str, int], Lane] = {}
        self.by_id: dict[int, Lane] = {}
        self.seq = 0

    def apply(self, op: list[Any]) -> None:
        kind = op[0]
        if kind == "L":
            _, lane_id, group, topic, queue_id, start = op
            lane = Lane(lane_id, group, topic, queue_id, start)
            replaced = self.lanes.get((group, topic, queue_id))
            if replaced is not None and replaced.id != lane_id:
                # A slave's own reader created this lane before the master's record arrived: the
                # master's lane wins (the reader's in-flight messages come again from it).
                self.by_id.pop(replaced.id, None)
            self.lanes[(group, topic, queue_id)] = lane
            self.by_id[lane_id] = lane
            return
        lane_found = self.by_id.get(op[1])
        if lane_found is None:
            raise CorruptRecordError(f"pop-state operation {kind!r} names lane {op[1]}, which no record created")
        lane = lane_found
        if kind == "P":
            lane.next_offset = max(lane.next_offset, op[2])
            for row in op[3]:
                entry = Inflight(*row)
                lane.hold(entry)
                self.seq = max(self.seq, entry.seq)
        elif kind == "A":
            for offset in op[2]:
                lane.inflight.pop(offset, None)
        elif kind == "C":
            changed = lane.inflight.get(op[2])
            if changed is not None:
                changed.until_ms, changed.seq = op[3], op[4]
                lane.hold(changed)
            self.seq = max(self.seq, op[4])
        elif kind == "R":
            lane.next_offset = op[2]
            lane.forget_all()
        elif kind == "D":
            del self.by_id[lane.id]
            if self.lanes.get((lane.group, lane.topic, lane.queue_id)) is lane:
                del self.lanes[(lane.group, lane.topic, lane.queue_id)]
        else:
            raise CorruptRecordError(f"unknown pop-state operation {kind!r}")


class PopState(_Lanes):
    """The lanes in memory plus their journal. Callers hold ``lock`` around read-modify-commit."""

    def __init__(self, journal: Journal, *, fsync: bool = False, compact_bytes: int = 8 << 20,
                 legacy_dir: Path | None = None) -> None:
        super().__init__()
        self.journal = journal
        self.lock = threading.RLock()
        self._fsync = fsync
        self._compact_bytes = compact_bytes
        self._closed = False
        self._local: set[tuple[str, str, int]] = set()  # lanes a slave's own readers changed
        with self.lock:
            self._load()
            if legacy_dir is not None:
                self._import_legacy(legacy_dir)

    @property
    def writable(self) -> bool:
        """False on a slave: changes stay in memory (see the module docstring)."""
        return self.journal.writable

    # ------------------------------------------------------------------------------ live changes
    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def lane(self, group: str, topic: str, queue_id: int, start: Callable[[], int]) -> Lane:
        """The lane of (group, topic, queue), created at offset ``start()`` on first use."""
        found = self.lanes.get((group, topic, queue_id))
        if found is not None:
            return found
        # A slave's readers number their lanes downwards: the master's ids never meet them.
        lane_id = max(self.by_id, default=0) + 1 if self.writable else min(min(self.by_id, default=0), 0) - 1
        self.commit([["L", lane_id, group, topic, queue_id, start()]])
        return self.by_id[lane_id]

    def commit(self, ops: list[list[Any]]) -> int | None:
        """Record ``ops`` (one journal record), then apply them; returns the log offset past the
        record for :meth:`settle` (None when nothing was written: no ops, or a slave)."""
        if not ops:
            return None
        if self._closed:
            raise ClientError("pop state is closed; the broker is closing")
        end = None
        writable = self.writable
        if writable:
            data = "".join(json.dumps(op, separators=(",", ":")) + "\n" for op in ops).encode()
            end = self.journal.append([data])
            if self._fsync:
                self.journal.store.flush()
        for op in ops:
            self.apply(op)
            if not writable and (lane := self.by_id.get(op[1])) is not None:
                self._local.add((lane.group, lane.topic, lane.queue_id))
        if end is not None and self.journal.bytes_since_snapshot >= self._compact_bytes:
            self.compact()
        return end

    def settle(self, end: int | None) -> None:
        """Wait until what a commit wrote is replicated (committed) before the client hears of it;
        call without ``lock``. ReplicationError when it was not in time: the client is told the
        operation failed (it took effect here, but a failover could still forget it)."""
        if end is not None and self.journal.settle(end) is not SendStatus.SEND_OK:
            raise ReplicationError("the consumer state change is recorded on this broker but was not replicated to "
                                   "its in-sync slaves in time; a failover could forget it, so it is not confirmed")

    # ------------------------------------------------------------------------------ journal
    def _reset(self) -> None:
        self.lanes.clear()
        self.by_id.clear()
        self.seq = 0

    def _load_snapshot(self, data: dict[str, Any], where: str) -> None:
        if data.get("version") != _VERSION:
            raise CorruptRecordError(f"{where} has version {data.get('version')!r}, expected {_VERSION}; "
                                     "it was written by another plugmq version")
        self.seq = max(self.seq, data["seq"])
        for lane_id, group, topic, queue_id, next_offset, rows in data["lanes"]:
            self.apply(["L", lane_id, group, topic, queue_id, next_offset])
            self.apply(["P", lane_id, next_offset, rows])

    def _apply_record(self, record: bytes) -> None:
        try:
            ops = [json.loads(line) for line in record.splitlines() if line]
        except ValueError as exc:
            raise CorruptRecordError(f"{self.journal.topic}: a pop-state record is not JSON ({exc}); the store "
                                     "holds a damaged record") from exc
        for op in ops:
            self.apply(op)

    def _load(self) -> None:
        replay = self.journal.replay()
        self._reset()
        if replay.snapshot is not None:
            self._load_snapshot(json.loads(replay.snapshot), f"{self.journal.topic} snapshot")
        for record in replay.records:
            self._apply_record(record)
        log.info("pop state loaded", lanes=len(self.lanes), inflight=self.inflight_count(),
                 replayed=len(replay.records), journal=self.journal.topic)

    def follow(self) -> bool:
        """Apply the records the master wrote since (a slave); a log cut below what was applied
        (the slave cut back to its new master's history) rebuilds the state from the journal.
        Returns whether anything changed."""
        with self.lock:
            return self.journal.apply_followed(self._apply_record, self._load)

    def reload(self) -> None:
        """Rebuild the state from the journal alone (the local changes of a slave's readers go)."""
        with self.lock:
            self._local.clear()
            self._load()

    def handover(self) -> ConsumerHandover:
        """On a slave: ``(group, topic, queue id, done below)`` of every lane its own readers
        changed since the last :meth:`handed_over` - offsets below ``done below`` are done for the
        group (the lowest in flight, else the cursor)."""
        with self.lock:
            return ConsumerHandover([(group, topic, queue_id, min(lane.inflight, default=lane.next_offset))
                                     for group, topic, queue_id in sorted(self._local)
                                     if (lane := self.lanes.get((group, topic, queue_id))) is not None])

    def handed_over(self, lanes: ConsumerHandover) -> None:
        """A master took ``lanes`` (from :meth:`handover`): forget them unless changed since."""
        with self.lock:
            for progress in lanes:
                lane = self.lanes.get(progress.key)
                if lane is None or min(lane.inflight, default=lane.next_offset) == progress.done_below:
                    self._local.discard(progress.key)

    def _import_legacy(self, directory: Path) -> None:
        files = _state_files(directory)
        if not files:
            return
        if self.lanes or self.journal.position > 0:
            log.warning("pop state files from before the journal ignored: the journal already holds pop state",
                        directory=str(directory))
            return
        if not self.writable:
            return  # a slave takes its master's state
        legacy = _LegacyFiles(directory)
        self._reset()
        self._load_snapshot({"version": _VERSION, "seq": legacy.seq, "lanes": legacy.lanes}, str(directory))
        self.compact()
        self.journal.store.flush()
        imported = directory.with_name(directory.name + ".imported")
        os.replace(directory, imported)
        log.info("pop state imported into the journal", source=str(directory), moved_to=str(imported),
                 lanes=len(self.lanes))

    def compact(self) -> None:
        """Write the whole state as a journal snapshot (records before it are no longer replayed)."""
        with self.lock:
            lanes = [[lane.id, lane.group, lane.topic, lane.queue_id, lane.next_offset,
                      [entry.row() for entry in lane.inflight.values()]] for lane in self.by_id.values()]
            data = json.dumps({"version": _VERSION, "seq": self.seq, "lanes": lanes}, separators=(",", ":"))
            self.journal.write_snapshot(data.encode())
            self._local.clear()  # a promoted slave's readers' progress is in its log now

    def inflight_count(self) -> int:
        return sum(len(lane.inflight) for lane in self.by_id.values())

    def drop_lanes(self, doomed: Iterable[Lane]) -> int:
        """Forget ``doomed`` lanes for good (in-flight messages included); returns how many."""
        ops: list[list[Any]] = [["D", lane.id] for lane in doomed]
        self.commit(ops)
        return len(ops)

    def close(self) -> None:
        with self.lock:
            self._closed = True


class _LegacyFiles:
    """The pop state of a data dir written before the journal: a snapshot plus a JSON-lines log."""

    def __init__(self, directory: Path) -> None:
        self.seq = 0
        self.lanes: list[list[Any]] = []
        state = _Lanes()
        snapshot = directory / _SNAPSHOT
        generation = 0
        if snapshot.exists():
            data = json.loads(snapshot.read_text(encoding="utf-8"))
            if data.get("version") != _VERSION:
                raise CorruptRecordError(f"{snapshot} has version {data.get('version')!r}, expected {_VERSION}")
            generation = data["generation"]
            state.seq = data["seq"]
            for lane_id, group, topic, queue_id, next_offset, rows in data["lanes"]:
                state.apply(["L", lane_id, group, topic, queue_id, next_offset])
                state.apply(["P", lane_id, next_offset, rows])
        path = directory / f"pop-{generation}.log"
        raw = path.read_bytes() if path.exists() else b""
        position = 0
        for line in raw.splitlines(keepends=True):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no line end")
                op = json.loads(line)
            except ValueError as exc:
                if position + len(line) == len(raw):
                    log.warning("pop-state log ends in a torn write; cut off", path=str(path), at=position)
                    break
                raise CorruptRecordError(f"{path}: unreadable record at byte {position} ({exc}); the log is damaged "
                                         f"beyond a torn tail: move the directory {directory} aside to reset "
                                         "pop consumers' progress (messages stay in the store)") from exc
            state.apply(op)
            position += len(line)
        self.seq = state.seq
        self.lanes = [[lane.id, lane.group, lane.topic, lane.queue_id, lane.next_offset,
                       [entry.row() for entry in lane.inflight.values()]] for lane in state.by_id.values()]
