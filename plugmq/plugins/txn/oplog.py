"""The op log: every decision, counted check and finished effect of the transaction service.

RocketMQ keeps decisions as messages of an op topic and matches them against the half queue on
every check pass; here they are fixed-size records in the broker's state journal (the commit log,
``rmq_sys_state_txn``), replayed once at start, so "is this transaction settled?" is a set lookup
and a restart - or a promoted slave - knows every decision::

    1 kind | 3 pad | 4 crc32(kind + half + value) | 8 half queue offset | 8 value   (24 bytes)

    C  commit decided    value = max offset of the real queue when decided (recovery looks there)
    R  rollback decided  terminal
    T  discard decided   value = max offset of the discard queue when decided
    D  done              the delivery of a C or T reached the store; terminal
    K  check counted     value = checks made so far; written before the check is made
    L  lost              the half message is gone from the store (retention); terminal
    W  watermark         every half offset below ``half`` is terminal (written by compaction)

A decision is written (and, with the fsync option, flushed; on a ``sync_master``, held by a slave)
before it takes effect; a D only after the store took the delivery, so a C or T without a D is the
one state recovery has to settle by looking.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import attrs

from plugmq.core import StateJournal
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
    """The op records in the broker's journal (``rmq_sys_state_txn``): appended in batches, a
    snapshot of the open state replaces them (``rewrite``), replayed at start. Records travel to
    slaves with the half messages, so a promoted slave knows every decision and counted check.

    A data dir written before the journal kept the records in ``<data_dir>/txn/oplog``: its valid
    records become the journal's first snapshot and the file is renamed ``oplog.imported``.
    """

    def __init__(self, journal: StateJournal, *, fsync: bool, legacy: Path | None = None) -> None:
        self._journal = journal
        self._fsync = fsync
        self._legacy = legacy
        self._snapshot_size = 0

    @property
    def size(self) -> int:
        """Bytes a replay reads: the latest snapshot plus the records after it."""
        return self._snapshot_size + self._journal.bytes_since_snapshot

    @property
    def snapshot_due(self) -> bool:
        """The latest snapshot holds the store's retention back: rewrite soon."""
        return self._journal.snapshot_due()

    def replay(self) -> OpState:
        """Apply the latest snapshot and every record after it (a record failing its CRC - never
        written by this plugin - is skipped with an error)."""
        replay = self._journal.replay()
        if replay.snapshot is None and not replay.records and self._legacy is not None and self._legacy.exists():
            return self._import_legacy(self._legacy)
        state = OpState()
        self._snapshot_size = len(replay.snapshot or b"")
        for data in ([replay.snapshot] if replay.snapshot else []) + list(replay.records):
            _apply_records(state, data, strict=False)
        state.prune()
        return state

    def _import_legacy(self, path: Path) -> OpState:
        data = path.read_bytes()
        state = OpState()
        valid = _apply_records(state, data, strict=True)
        if valid != len(data):
            log.warning("transaction op log tail cut", path=str(path), valid=valid, size=len(data))
        if self._journal.writable:
            self.rewrite([data[:valid]])
            self._journal.sync()
            imported = path.with_name(path.name + ".imported")
            os.replace(path, imported)
            log.info("transaction op log imported into the journal", source=str(path), moved_to=str(imported),
                     records=state.records)
        state.prune()
        return state

    def append(self, data: bytes) -> int:
        """Append records (the caller serialises appends); returns the position ``sync_to`` takes."""
        return self._journal.append([data])

    def sync_to(self, position: int) -> None:
        """Make the records up to ``position`` durable (the store's flush, with the fsync option)
        and, on a ``sync_master``, held by a slave."""
        if self._fsync:
            self._journal.sync()
        self._journal.settle(position)

    def sync(self) -> None:
        if self._fsync:
            self._journal.sync()

    def rewrite(self, records: Iterable[bytes]) -> None:
        """Replace what replay reads with ``records`` (one journal snapshot)."""
        data = b"".join(records)
        self._journal.write_snapshot(data)
        self._snapshot_size = len(data)

    def close(self) -> None:
        self.sync()


def _apply_records(state: OpState, data: bytes, *, strict: bool) -> int:
    """Apply the records in ``data``; returns the bytes of valid records read. ``strict`` (an
    old file) stops at the first bad one - only a torn tail can be bad there."""
    pos = 0
    while pos + RECORD_SIZE <= len(data):
        kind, crc, half, value = _RECORD.unpack_from(data, pos)
        if kind not in _KINDS or zlib.crc32(_CRC_PART.pack(kind, half, value)) != crc:
            if strict:
                break
            log.error("transaction op record failed its check; skipped", kind=kind, half=half)
        else:
            state.apply(kind, half, value)
        pos += RECORD_SIZE
    return pos
