"""Consume queues: per (topic, queue id) a log of fixed 20-byte entries
``commit_log_offset:int64 | size:int32 | tag_hash:int64`` (big-endian), in files of
``entries_per_file`` entries under ``consumequeue/<topic>/<queue id>/<20-digit byte offset>``.

Entry ``n`` lives at byte ``n * 20`` of the queue, so the queue offset is the entry index and a
dispatched entry can be (re)written in place: rebuilding from the commit log is idempotent.
An entry with size 0 was never written. The last file of a queue is never removed by retention,
so the queue's max offset survives even when every message has expired.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from plugmq.core import ConsumeQueueEntry, StoreError, validate_topic
from plugmq.core.errors import InvalidNameError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.layout import CQ_ENTRY
from plugmq.plugins.store_mmap.mapped_file import MappedFile, offset_name

__all__ = ["ENTRY", "ENTRY_SIZE", "ConsumeQueue", "ConsumeQueues"]

log = get_logger(__name__)

ENTRY = CQ_ENTRY
ENTRY_SIZE = ENTRY.size
_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])
_NAME = re.compile(r"\d{20}")
_ALLOCATION_CHUNK = 4096 * ENTRY_SIZE  # entries given blocks at a time ahead of the writes


class ConsumeQueue:
    """One queue's entry files. Writes happen under the store's put lock; reads need no lock."""

    __slots__ = (
        "_cur",
        "_cur_base",
        "_files",
        "dir",
        "file_bytes",
        "flushed_upto",
        "max_offset",
        "min_offset",
        "per_file",
        "queue_id",
        "room",
        "topic",
    )

    def __init__(self, root: Path, topic: str, queue_id: int, per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = root / topic / str(queue_id)
        self.per_file = per_file
        self.file_bytes = per_file * ENTRY_SIZE
        self._files: tuple[MappedFile, ...] = ()
        self.min_offset = 0
        self.max_offset = 0  # one past the highest written entry
        self.flushed_upto = 0
        self._cur: MappedFile | None = None
        self._cur_base = 0
        self.room = 0  # entries of the current file that have blocks (writes beyond reserve first)

    # -- files --------------------------------------------------------------------------------

    @property
    def files(self) -> tuple[MappedFile, ...]:
        return self._files

    def _base(self, f: MappedFile) -> int:
        return f.start // ENTRY_SIZE

    def load(self) -> bool:
        """Map the existing files; False if they are inconsistent (the caller rebuilds)."""
        names = sorted(p.name for p in self.dir.iterdir() if _NAME.fullmatch(p.name))
        for leftover in self.dir.glob("*.tmp"):
            leftover.unlink()
        files: list[MappedFile] = []
        ok = True
        for name in names:
            f = MappedFile.open(self.dir / name, int(name))
            files.append(f)
            if f.size != self.file_bytes or f.start % self.file_bytes or (len(files) > 1 and files[-2].end != f.start):
                ok = False
        if not ok:
            for f in files:
                f.close()
            log.warning("consume queue files inconsistent; will rebuild", topic=self.topic, queue=self.queue_id)
            return False
        self._files = tuple(files)
        return True

    def _file_for(self, qoff: int) -> MappedFile | None:
        files = self._files
        if not files:
            return None
        i = qoff // self.per_file - self._base(files[0]) // self.per_file
        if 0 <= i < len(files):
            return files[i]
        return None

    def _create_until(self, qoff: int) -> MappedFile:
        """Create files so that one holds ``qoff`` (contiguous with the existing ones)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        want = qoff // self.per_file * self.file_bytes
        files = list(self._files)
        if not files:
            files.append(MappedFile.create(self.dir / offset_name(want), want, self.file_bytes, reserve=0))
        while files[-1].end <= want:
            start = files[-1].end
            files.append(MappedFile.create(self.dir / offset_name(start), start, self.file_bytes, reserve=0))
        while files[0].start > want:
            start = files[0].start - self.file_bytes
            files.insert(0, MappedFile.create(self.dir / offset_name(start), start, self.file_bytes, reserve=0))
        self._files = tuple(files)
        found = self._file_for(qoff)
        assert found is not None
        return found

    # -- writing (under the put lock) ---------------------------------------------------------

    def prepare(self, first: int, count: int = 1) -> None:
        """Before a record is written: make sure the files for entries ``first .. first+count-1``
        exist and have blocks for them (StoreFullError otherwise), and make the first one current
        with ``room`` set to its allocated entries, so a full disk refuses the append before the
        commit log holds a record without its entry."""
        last = first + max(count, 1) - 1
        q = first
        while q <= last:
            f = self._file_for(q) or self._create_until(q)
            base = self._base(f)
            upto = min(last, base + self.per_file - 1)
            f.reserve((upto - base + 1) * ENTRY_SIZE, _ALLOCATION_CHUNK)
            q = upto + 1
        self._make_next_early(last)
        current = self._file_for(first)
        assert current is not None
        self._cur = current
        self._cur_base = self._base(current)
        self.room = current.allocated // ENTRY_SIZE

    def _make_next_early(self, last: int) -> None:
        """Once ``last`` is in the final eighth of its file, make the next file: a queue whose file
        fills while the descriptor table is full (or the disk) keeps going on the one made
        earlier, and a failure here costs nothing (the boundary tries again)."""
        base = last // self.per_file * self.per_file
        following = base + self.per_file
        if last - base < self.per_file - self.per_file // 8 or self._file_for(following) is not None:
            return
        try:
            self._create_until(following)
        except StoreError as exc:
            log.debug("next consume-queue file not made early", topic=self.topic, queue=self.queue_id,
                      error=str(exc))

    def put(self, qoff: int, phys: int, size: int, tags: int) -> None:
        cur = self._cur
        rel = qoff - self._cur_base
        if cur is None or rel < 0 or rel >= self.per_file:
            cur = self._file_for(qoff) or self._create_until(qoff)
            self._cur = cur
            self._cur_base = self._base(cur)
            rel = qoff - self._cur_base
        if (rel + 1) * ENTRY_SIZE > cur.allocated:
            cur.reserve((rel + 1) * ENTRY_SIZE, _ALLOCATION_CHUNK)
            self.room = cur.allocated // ENTRY_SIZE
        ENTRY.pack_into(cur.mm, rel * ENTRY_SIZE, phys, size, tags)
        if qoff >= self.max_offset:
            self.max_offset = qoff + 1

    def put_many(self, qoffs: np.ndarray, phys: np.ndarray, sizes: np.ndarray, tags: np.ndarray) -> None:
        """Recovery: write many entries at once (int64 arrays of one length, any queue offsets),
        file by file, each file given blocks first. Later entries for one offset win, as with
        ``put`` one by one."""
        if not qoffs.size:
            return
        which = qoffs // self.per_file
        order = np.arange(which.size) if np.all(which[1:] >= which[:-1]) else np.argsort(which, kind="stable")
        for pick in np.split(order, np.flatnonzero(np.diff(which[order])) + 1):
            base = int(which[pick[0]]) * self.per_file
            rel = qoffs[pick] - base
            if rel.size > 1 and not np.all(np.diff(rel) > 0):  # repeated offsets: keep the last of each
                last = rel.size - 1 - np.unique(rel[::-1], return_index=True)[1]
                pick, rel = pick[last], rel[last]
            f = self._file_for(base) or self._create_until(base)
            f.reserve((int(rel.max()) + 1) * ENTRY_SIZE, _ALLOCATION_CHUNK)
            entries = np.frombuffer(f.mm, dtype=_DTYPE, count=self.per_file)
            entries["phys"][rel] = phys[pick]
            entries["size"][rel] = sizes[pick]
            entries["tags"][rel] = tags[pick]
            del entries  # the view exports the mapping: drop it before anyone may close the file
        self.max_offset = max(self.max_offset, int(qoffs.max()) + 1)
        self._cur = None  # the next append prepares its file (and its ``room``) again

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int, max_entries: int,
             entries_of: Callable[[bytes, int], list[ConsumeQueueEntry]]) -> list[ConsumeQueueEntry]:
        """Up to ``max_entries`` entries from ``offset``; ``entries_of(chunk, first queue offset)``
        builds them (the store's scan kernel: compiled, or its Python twin)."""
        lo = max(offset, self.min_offset)
        hi = min(self.max_offset, lo + max(0, max_entries))
        out: list[ConsumeQueueEntry] = []
        while lo < hi:
            chunk = self._chunk(lo, hi)
            if not chunk:
                break
            out += entries_of(chunk, lo)
            lo += len(chunk) // ENTRY_SIZE
        return out

    def run(self, offset: int, max_entries: int) -> tuple[int, bytes]:
        """The raw 20-byte entries from ``offset`` (the first kept one when it is below), at most
        ``max_entries``, as far as the file holding the first one reaches: (first queue offset, bytes)."""
        lo = max(offset, self.min_offset)
        return lo, self._chunk(lo, min(self.max_offset, lo + max(0, max_entries)))

    def _chunk(self, lo: int, hi: int) -> bytes:
        """The entries ``[lo, hi)`` as far as the file holding ``lo`` reaches (b"" when none)."""
        f = self._file_for(lo) if lo < hi else None
        if f is None or not f.acquire():
            return b""
        try:
            rel = lo - self._base(f)
            return f.mm[rel * ENTRY_SIZE : (rel + min(hi - lo, self.per_file - rel)) * ENTRY_SIZE]
        finally:
            f.release()

    def entry(self, qoff: int) -> tuple[int, int, int] | None:
        if not self.min_offset <= qoff < self.max_offset:
            return None
        f = self._file_for(qoff)
        if f is None or not f.acquire():
            return None
        try:
            phys, size, tags = ENTRY.unpack_from(f.mm, (qoff - self._base(f)) * ENTRY_SIZE)
            return phys, size, tags
        finally:
            f.release()

    # -- recovery -----------------------------------------------------------------------------

    def cut(self, end_phys: int) -> None:
        """Drop entries pointing at or past ``end_phys`` (they are re-dispatched or gone) and set
        ``max_offset`` after the last remaining entry. The last file is kept even if emptied."""
        files = list(self._files)
        self.max_offset = 0
        while files:
            f = files[-1]
            # Only the part holding data: past it there are holes, which a tmpfs mapping would have
            # to allocate to read (SIGBUS on a full file system).
            arr = np.frombuffer(f.mm, dtype=_DTYPE, count=min(self.per_file, f.data_end() // ENTRY_SIZE))
            written = arr["size"] > 0
            keep = np.flatnonzero(written & (arr["phys"] < end_phys))
            last_keep = int(keep[-1]) if keep.size else -1
            if np.any(written[last_keep + 1 :]):
                del arr, written
                f.zero((last_keep + 1) * ENTRY_SIZE)
            else:
                del arr, written
            if last_keep >= 0 or len(files) == 1:
                self.max_offset = self._base(f) + last_keep + 1 if last_keep >= 0 else self._base(f)
                break
            files.pop().destroy()
        self._files = tuple(files)
        self._cur = None
        self.flushed_upto = 0

    def newest_written(self) -> tuple[int, tuple[int, int] | None]:
        """One past the highest entry the files hold, and that entry's (commit-log offset, size)
        (read before recovery cuts anything; None without entries)."""
        for f in reversed(self._files):
            arr = np.frombuffer(f.mm, dtype=_DTYPE, count=min(self.per_file, f.data_end() // ENTRY_SIZE))
            hit = np.flatnonzero(arr["size"] > 0)
            if hit.size:
                last = arr[int(hit[-1])]
                newest = (int(last["phys"]), int(last["size"]))
                del arr, last
                return self._base(f) + int(hit[-1]) + 1, newest
            del arr
        return 0, None

    def fix_min_offset(self, commit_log_min: int) -> None:
        """The first entry whose message is still in the commit log (retention moves it)."""
        for f in self._files:
            base = self._base(f)
            if base >= self.max_offset:
                break
            arr = np.frombuffer(f.mm, dtype=_DTYPE, count=min(self.per_file, self.max_offset - base))
            hit = np.flatnonzero((arr["size"] > 0) & (arr["phys"] >= commit_log_min))
            del arr
            if hit.size:
                self.min_offset = base + int(hit[0])
                return
        self.min_offset = self.max_offset

    def drop_expired(self, commit_log_min: int) -> int:
        """Retention: remove files (never the last) whose entries all point below ``commit_log_min``."""
        removed = 0
        files = list(self._files)
        while len(files) > 1:
            f = files[0]
            last_phys = ENTRY.unpack_from(f.mm, self.file_bytes - ENTRY_SIZE)[0]
            if last_phys >= commit_log_min:
                break
            files.pop(0)
            self._files = tuple(files)
            f.destroy()
            removed += 1
        self._cur = None
        self.fix_min_offset(commit_log_min)
        return removed

    # -- flushing -----------------------------------------------------------------------------

    def flush(self, everything: bool = False) -> bool:
        top = self.max_offset
        if not everything and top <= self.flushed_upto:
            return False
        for f in self._files:
            base = self._base(f)
            if not everything and (base + self.per_file <= self.flushed_upto or base >= top):
                continue
            if f.acquire():
                try:
                    f.flush()
                finally:
                    f.release()
        self.flushed_upto = top
        return True

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = ()
        self._cur = None


class ConsumeQueues:
    """All consume queues of the store, keyed by (topic, queue id)."""

    def __init__(self, root: Path, per_file: int) -> None:
        self.root = root
        self.per_file = per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> bool:
        """Map every queue on disk; False if some queue had to be dropped (rebuild needed) or the
        directory is missing."""
        if not self.root.is_dir():
            self.root.mkdir(parents=True)
            return False
        complete = True
        for topic_dir in sorted(self.root.iterdir()):
            try:
                topic = validate_topic(topic_dir.name)
            except InvalidNameError:
                log.warning("ignoring a directory that is not a topic", path=str(topic_dir))
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.name.isdigit():
                    log.warning("ignoring a directory that is not a queue id", path=str(qdir))
                    continue
                cq = ConsumeQueue(self.root, topic, int(qdir.name), self.per_file)
                if cq.load():
                    self.queues[(topic, cq.queue_id)] = cq
                else:
                    shutil.rmtree(qdir)
                    complete = False
        return complete

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A new queue; the name is validated here because it becomes a directory."""
        validate_topic(topic)
        if not isinstance(queue_id, int) or queue_id < 0:
            raise InvalidNameError(f"queue id must be an int >= 0, got {queue_id!r}")
        cq = self.queues[(topic, queue_id)] = ConsumeQueue(self.root, topic, queue_id, self.per_file)
        return cq

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self.queues.values()))

    def topics(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic, qid in list(self.queues):
            out[topic] = max(out.get(topic, 0), qid + 1)
        return out

    def close(self) -> None:
        for cq in self:
            cq.close()
        self.queues.clear()
