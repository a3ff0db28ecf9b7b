"""Index files: message key -> commit-log offsets (RocketMQ's IndexFile / IndexService).

One file::

    header (40 bytes)  beginTimestamp:int64 | endTimestamp:int64 | beginPhyOffset:int64 |
                       endPhyOffset:int64 | hashSlotCount:int32 | indexCount:int32
    slots              slot_count x int32: the newest entry number of the slot (0 = empty)
    entries            max_entries x 20 bytes: keyHash:int32 | phyOffset:int64 |
                       timeDiff:int32 (seconds since beginTimestamp) | prevIndex:int32

Entry numbers start at 1 (0 means "none"), so a file holds ``max_entries - 1`` entries, like
RocketMQ. A key ``topic#key`` goes to slot ``abs(hashCode) % slot_count``; the slot holds its
newest entry and each entry links to the previous one of the same slot. Files are named by the
commit-log offset of their first entry (20 digits), which makes "rebuild from offset X" exact.

Entries are inserted in batches with numpy (entries first, then slots, then the header), so a
process killed mid-batch leaves at most entries past ``indexCount`` that recovery undoes.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.keyhash import index_key_hashes
from plugmq.plugins.store_mmap.mapped_file import MappedFile, offset_name

__all__ = ["IndexFile", "IndexService", "key_entries"]

log = get_logger(__name__)

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 20
_DTYPE = np.dtype([("hash", ">i4"), ("phys", ">i8"), ("tdiff", ">i4"), ("prev", ">i4")])
_SLOT = struct.Struct(">i")
_NAME = re.compile(r"\d{20}")
_INT32_MAX = 0x7FFFFFFF
_ALLOCATION_CHUNK = 65_536 * ENTRY_SIZE  # entry bytes given disk blocks at a time


class IndexFile:
    def __init__(self, mf: MappedFile, slot_count: int, max_entries: int) -> None:
        self.mf = mf
        self.slot_count = slot_count
        self.max_entries = max_entries
        self._entries_at = HEADER_SIZE + slot_count * 4
        (self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.slot_used, self.count) = HEADER.unpack_from(
            mf.mm, 0
        )
        self.count = max(self.count, 1)
        self.slots = np.frombuffer(mf.mm, dtype=">i4", count=slot_count, offset=HEADER_SIZE)
        self.entries = np.frombuffer(mf.mm, dtype=_DTYPE, count=max_entries, offset=self._entries_at)

    def reserve_entries(self, count: int) -> None:
        """Before entries below ``count`` are written: give them (and header and slots) disk
        blocks, or StoreFullError."""
        self.mf.reserve(self._entries_at + count * ENTRY_SIZE, _ALLOCATION_CHUNK)

    @staticmethod
    def file_size(slot_count: int, max_entries: int) -> int:
        return HEADER_SIZE + slot_count * 4 + max_entries * ENTRY_SIZE

    @property
    def name_offset(self) -> int:
        return self.mf.start

    @property
    def room(self) -> int:
        return self.max_entries - self.count

    @property
    def empty(self) -> bool:
        return self.count <= 1

    def _write_header(self) -> None:
        HEADER.pack_into(
            self.mf.mm, 0, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.slot_used, self.count
        )

    def insert(self, key_hash: np.ndarray, phys: np.ndarray, ts: np.ndarray) -> None:
        """Add entries (at most ``room``), in commit-log order."""
        k = int(key_hash.size)
        if k == 0:
            return
        if self.empty:
            self.begin_ts = int(ts[0])
            self.begin_phys = int(phys[0])
        idx = np.arange(self.count, self.count + k, dtype=np.int64)
        slot = key_hash % self.slot_count
        tdiff = np.clip((ts - self.begin_ts) // 1000, 0, _INT32_MAX)
        # Chain entries of the same slot within the batch: each links to the previous one of its
        # slot, the first of a slot to the slot's current head.
        order = np.argsort(slot, kind="stable")
        s_sorted = slot[order]
        i_sorted = idx[order]
        first = np.empty(k, dtype=bool)
        first[0] = True
        first[1:] = s_sorted[1:] != s_sorted[:-1]
        last = np.empty(k, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        heads = self.slots[s_sorted[first]].astype(np.int64)
        heads[(heads < 0) | (heads >= self.count)] = 0  # a head past indexCount is garbage
        prev_sorted = np.empty(k, dtype=np.int64)
        prev_sorted[1:] = i_sorted[:-1]
        prev_sorted[first] = heads
        prev = np.empty(k, dtype=np.int64)
        prev[order] = prev_sorted
        view = self.entries[self.count : self.count + k]
        view["hash"] = key_hash
        view["phys"] = phys
        view["tdiff"] = tdiff
        view["prev"] = prev
        del view
        self.slots[s_sorted[last]] = i_sorted[last]
        self.slot_used += int(np.count_nonzero(heads == 0))
        self.count += k
        self.end_phys = int(phys[-1])
        self.end_ts = max(self.end_ts, int(ts[-1]))
        self._write_header()

    def lookup(self, key_hash: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit-log offsets of entries with ``key_hash`` stored in [begin_ms, end_ms], newest first."""
        mm = self.mf.mm
        i = _SLOT.unpack_from(mm, HEADER_SIZE + (key_hash % self.slot_count) * 4)[0]
        out = []
        count = self.count
        at = self._entries_at
        while 0 < i < count:
            h, phys, tdiff, prev = ENTRY.unpack_from(mm, at + i * ENTRY_SIZE)
            when = self.begin_ts + tdiff * 1000
            if h == key_hash and when + 999 >= begin_ms and when <= end_ms:
                out.append(phys)
            if prev >= i:  # links only go backwards; anything else is damage
                break
            i = prev
        return out

    def cut(self, end_phys: int) -> None:
        """Remove entries for commit-log offsets >= ``end_phys``, plus anything written past
        ``indexCount`` by a batch that did not finish; restore the slots they had replaced."""
        count = self.count
        phys = self.entries["phys"][1:count]
        keep = 1 + int(np.searchsorted(phys, end_phys, side="left"))
        del phys
        if keep == count and not self._written_past(count):
            return
        mm = self.mf.mm
        at = self._entries_at
        # Each slot whose head is cut falls back along its chain to the first entry kept; all
        # such slots step together (chains of the cut entries are short).
        cut_slots = np.flatnonzero(self.slots >= keep)
        heads = self.slots[cut_slots].astype(np.int64)
        prevs = self.entries["prev"]
        while True:
            walking = np.flatnonzero(heads >= keep)
            if not walking.size:
                break
            j = heads[walking]
            inside = j < self.max_entries  # a head past the file is garbage: the slot empties
            prev = np.zeros(j.size, dtype=np.int64)
            prev[inside] = prevs[j[inside]]
            heads[walking] = np.where(inside & (prev >= 0) & (prev < j), prev, 0)
        del prevs
        self.slots[cut_slots] = heads
        top = min(self.max_entries, count + 4096)
        self.mf.zero(at + keep * ENTRY_SIZE, at + top * ENTRY_SIZE)
        self.count = keep
        self.slot_used = int(np.count_nonzero(self.slots))
        if keep > 1:
            _h, last_phys, tdiff, _ = ENTRY.unpack_from(mm, at + (keep - 1) * ENTRY_SIZE)
            self.end_phys = last_phys
            self.end_ts = self.begin_ts + tdiff * 1000 + 999
        else:
            self.end_phys = self.begin_phys
            self.end_ts = self.begin_ts
        self._write_header()
        log.info("index entries cut", file=self.mf.path.name, kept=keep - 1, at=end_phys)

    def _written_past(self, count: int) -> bool:
        top = min(self.max_entries, count + 4096)
        return not self.mf.is_zero(self._entries_at + count * ENTRY_SIZE, self._entries_at + top * ENTRY_SIZE)

    def flush(self) -> None:
        if self.mf.acquire():
            try:
                self.mf.flush()
            finally:
                self.mf.release()

    def close(self, destroy: bool = False) -> None:
        # The numpy views export the mapping; drop them before unmapping.
        self.slots = self.entries = None  # type: ignore[assignment]
        if destroy:
            self.mf.destroy()
        else:
            self.mf.close()


def key_entries(
    items: Sequence[tuple[str, str | None, str | None, int, int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index entries of ``(topic, keys, unique id, offset, store time)`` items: one per key of
    ``keys`` (split on white space) and one for the unique id, as (hashes, offsets, times)."""
    texts: list[str] = []
    phys: list[int] = []
    stamps: list[int] = []
    for topic, keys, uniq, offset, ts in items:
        if keys:
            for key in keys.split():
                texts.append(f"{topic}#{key}")
                phys.append(offset)
                stamps.append(ts)
        if uniq:
            texts.append(f"{topic}#{uniq}")
            phys.append(offset)
            stamps.append(ts)
    if not texts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return index_key_hashes(texts), np.array(phys, dtype=np.int64), np.array(stamps, dtype=np.int64)


class IndexService:
    """The index files plus the queue of keys waiting to be indexed.

    The append path only records ``(topic, keys, unique id, offset, store time)`` in ``pending``
    (under the put lock); :meth:`drain` indexes them in a vectorised batch. Queries drain first,
    so a query sees every message appended before it.
    """

    def __init__(self, directory: Path, slot_count: int, max_entries: int) -> None:
        self.dir = directory
        self.slot_count = slot_count
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self.lock = threading.RLock()
        self.indexed_upto = 0  # commit-log offset: every record below it is indexed
        self._dirty: set[IndexFile] = set()

    def load(self) -> bool:
        """Map the index files; False if the directory was missing (a full rebuild is needed)."""
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True)
            return False
        for leftover in self.dir.glob("*.tmp"):
            leftover.unlink()
        size = IndexFile.file_size(self.slot_count, self.max_entries)
        complete = True
        for name in sorted(p.name for p in self.dir.iterdir() if _NAME.fullmatch(p.name)):
            mf = MappedFile.open(self.dir / name, int(name))
            if mf.size != size:
                log.warning("index file has another geometry; removing it for a rebuild", file=name)
                mf.destroy()
                complete = False
                continue
            self.files.append(IndexFile(mf, self.slot_count, self.max_entries))
        return complete

    def cut(self, end_phys: int) -> None:
        """Recovery: drop every entry for offsets >= ``end_phys``."""
        with self.lock:
            while self.files and self.files[-1].name_offset >= end_phys:
                self.files.pop().close(destroy=True)
            if self.files:
                self.files[-1].cut(end_phys)
                if self.files[-1].empty:
                    self.files.pop().close(destroy=True)
                else:
                    self._dirty.add(self.files[-1])  # the next flush makes the cut durable
            self.indexed_upto = end_phys

    def add(self, items: Sequence[tuple[str, str | None, str | None, int, int]]) -> None:
        """Index ``(topic, keys, unique id, offset, store time)`` items, in commit-log order."""
        self.add_arrays(*key_entries(items))

    def add_arrays(self, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
        """Index entries given as index key hashes, commit-log offsets and store times (int64
        arrays of one length), in commit-log order: the append kernels note them this way."""
        count = int(hashes.size)
        if not count:
            return
        with self.lock:
            done = 0
            while done < count:
                f = self.files[-1] if self.files else None
                if f is None or f.room <= 0:
                    f = self._new_file(int(phys[done]))
                n = min(f.room, count - done)
                f.reserve_entries(f.count + n)
                f.insert(hashes[done : done + n], phys[done : done + n], stamps[done : done + n])
                self._dirty.add(f)
                done += n

    def _new_file(self, begin_phys: int) -> IndexFile:
        size = IndexFile.file_size(self.slot_count, self.max_entries)
        # Header and slots (written anywhere) get blocks now, entries as they are added.
        mf = MappedFile.create(self.dir / offset_name(begin_phys), begin_phys, size,
                               reserve=HEADER_SIZE + self.slot_count * 4)
        f = IndexFile(mf, self.slot_count, self.max_entries)
        self.files.append(f)
        return f

    def lookup(self, key: str, begin_ms: int, end_ms: int) -> list[int]:
        """Candidate offsets for ``key`` (already ``topic#key``), newest first. Hash collisions
        are possible: the caller checks each message."""
        key_hash = int(index_key_hashes([key])[0])
        out: list[int] = []
        with self.lock:
            for f in reversed(self.files):
                if f.empty or f.end_ts + 999 < begin_ms or f.begin_ts > end_ms:
                    continue
                out.extend(f.lookup(key_hash, begin_ms, end_ms))
        return out

    def drop_expired(self, commit_log_min: int) -> int:
        """Retention: remove files (never the newest) whose entries all point below the log's start."""
        removed = 0
        with self.lock:
            while len(self.files) > 1 and self.files[0].end_phys < commit_log_min:
                self.files.pop(0).close(destroy=True)
                removed += 1
        return removed

    def flush(self, everything: bool = False) -> None:
        with self.lock:
            for f in self.files:
                if everything or f in self._dirty:
                    f.flush()
            self._dirty.clear()

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files.clear()
