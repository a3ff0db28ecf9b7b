"""MmapMessageStore: RocketMQ's DefaultMessageStore on mmap'ed files.

Layout under the plugin directory::

    lock            flock'ed while open: one process per store
    abort           exists while open; found at open = the last run crashed
    checkpoint      how far commit log / consume queues / index are durable
    commitlog/      segments named by their 20-digit start offset
    consumequeue/<topic>/<queue id>/   20-byte entries
    index/          key index files named by the offset of their first entry

The append path (``appender.py``): under the put lock one call of the append kernel checks and
encodes every request of the call, then writes the records straight into the mapped segment and
their entries into the mapped consume-queue files, notes index entries in a pending buffer and
publishes the new ends; it returns to the store only to roll a segment, give a file disk blocks
(before any byte is written into them) or open a queue. Sync flush then waits for a group commit;
the index is filled from the pending buffer in batches.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

import attrs
import numpy as np

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    Clock,
    ConsumeQueueEntry,
    StoreCapabilities,
    StoredMessage,
    StoreError,
    ValidationError,
    encode_msg_id,
    validate_topic,
)
from plugmq.core.appendcolumns import AppendColumns
from plugmq.core.clock import SystemClock
from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE, decode_msg_id
from plugmq.core.retention import RetentionFloor
from plugmq.kit.diskspace import is_disk_full
from plugmq.plugins.store_mmap.appender import (
    NEED_ALLOCATE,
    NEED_CQ_FILE,
    NEED_QUEUE,
    NEED_ROLL,
    Appender,
    IndexEntries,
    PyAppender,
    make_appender,
)
from plugmq.plugins.store_mmap.checkpoint import Checkpoint, CheckpointData
from plugmq.plugins.store_mmap.commitlog import CommitLog
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueues
from plugmq.plugins.store_mmap.flush import FlushService, GroupCommit
from plugmq.plugins.store_mmap.indexfile import IndexService, key_entries
from plugmq.plugins.store_mmap.mapped_file import fsync_dir
from plugmq.plugins.store_mmap.options import MmapStoreOptions
from plugmq.plugins.store_mmap.record import build_tail, host_bytes, topic_part
from plugmq.plugins.store_mmap.recovery import recover, repair_queue
from plugmq.plugins.store_mmap.replica import ReplicaLog
from plugmq.plugins.store_mmap.retention import Retention
from plugmq.plugins.store_mmap.scan import entry_reader, make_scan_kernel

__all__ = ["CAPABILITIES", "MmapMessageStore"]

log = get_logger(__name__)

CAPABILITIES = StoreCapabilities(
    sync_flush=True,
    async_flush=True,
    query_by_key=True,
    query_by_time=True,
    crash_recovery=True,
    retention=True,
    concurrent_writers=True,
    replication=True,
)

FLUSH_DISK_TIMEOUT = AppendStatus.FLUSH_DISK_TIMEOUT
_REPAIR_WINDOW = 4096  # entries checked on each side of a read miss (a 4 KiB page holds 204)


def _mark_open(abort: Path) -> None:
    """Create the abort file (it says "open"; found at the next open it says "crashed"). Its
    content, the pid, is only informative: on a full disk the empty file still says it."""
    fd = os.open(abort, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, str(os.getpid()).encode())
    except OSError as exc:
        if not is_disk_full(exc):
            raise
    finally:
        os.close(fd)
    fsync_dir(abort.parent)


class MmapMessageStore(ReplicaLog):
    """The default store. Thread-safe; one instance per directory (enforced with a file lock).

    Log shipping to and from other stores of the same segment size: :class:`ReplicaLog`.
    """

    capabilities = CAPABILITIES

    def __init__(
        self,
        directory: Path,
        options: MmapStoreOptions | None = None,
        *,
        clock: Clock,
        store_host: str = "127.0.0.1:10911",
        max_message_size: int = DEFAULT_MAX_BODY_SIZE,
        retention: RetentionFloor | None = None,
    ) -> None:
        self.options = opts = options or MmapStoreOptions()
        self.retention = retention  # what consumers still need; retention never cleans below it
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._max_body = max_message_size
        store_b = host_bytes(store_host)
        if store_b is None:
            raise StoreError(f"store host {store_host!r} must be IPv4:port (it is part of every message id)")
        self._store_host = store_host
        self._store_host_b = store_b
        self._id_prefix = encode_msg_id(store_host, 0)[:16]
        self._closed = True
        self._lock_fd = self._take_dir_lock()
        try:
            self._open(opts)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _take_dir_lock(self) -> int:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(
                    f"store directory {self.dir} is already open (in this or another process); close that store first"
                ) from exc
            raise
        return fd

    def _open(self, opts: MmapStoreOptions) -> None:
        abort = self.dir / "abort"
        crashed = abort.exists()
        _mark_open(abort)

        self._put_lock = threading.Lock()
        self._derived_lock = threading.Lock()
        self._unindexed: list[tuple[str, str | None, str | None, int, int]] = []  # replicated, not yet indexed
        self._index_retry: list[IndexEntries] = []  # entries a full disk kept out of the index
        self._index_full_logged = -60_000  # store time of the last "index full" warning
        self._repair_lock = threading.Lock()
        self._queue_entries_repaired = 0
        self._records_lost = 0
        self._topics: dict[str, tuple[bytes, bytes, int]] = {}  # topic -> (prefix, bare tail, its CRC)
        self._index_batch = opts.index_batch
        self._index_unique = opts.index_unique_id
        self._replicated_messages = 0  # records a slave received from its master (not through the kernel)
        self._replicated_bytes = 0
        self._now_ms = self._clock.now_ms
        self._sync = opts.flush == "sync"

        self._cl = CommitLog(
            self.dir / "commitlog",
            opts.commit_log_segment_size,
            warm=opts.warm_segments,
            preallocate=opts.preallocate_next_segment,
        )
        self._cqs = ConsumeQueues(self.dir / "consumequeue", opts.consume_queue_entries_per_file)
        self._index = IndexService(self.dir / "index", opts.index_slot_count, opts.index_max_entries)
        self._checkpoint = Checkpoint(self.dir / "checkpoint")
        try:
            self._scan_kernel = make_scan_kernel(opts.scan_kernel)
            self._entries_of = entry_reader(self._scan_kernel)
            checkpoint = self._checkpoint.read()
            recovered = recover(
                self._cl,
                self._cqs,
                self._index,
                checkpoint,
                crashed=crashed,
                check_segments=opts.recover_check_segments,
                index_unique_id=opts.index_unique_id,
                kernel=self._scan_kernel,
            )
            self.recovery = recovered.report
            if recovered.unindexed is not None:
                self._index_retry.append(recovered.unindexed)
            self._lost_entries = recovered.lost_entries
            self._cl.open_for_write(self.recovery.end)
            self._max_record = self._cl.max_record
        except BaseException:
            self._release_files()
            raise
        if crashed:
            # Records recovered from the page cache of the dead process are not known durable past
            # what the checkpoint vouched for: the flush thread writes them back as it starts, so
            # the store opens without waiting for that I/O (the checkpoint never claims more).
            durable = checkpoint.commit_log_offset if checkpoint is not None else 0
            self._cl.flushed = max(self._cl.min_offset, min(self._cl.flushed, durable))
        try:
            self._appender: Appender = make_appender(
                opts.append_kernel,
                commit_log=self._cl,
                consume_queues=self._cqs,
                topics=self._topics,
                learn_topic=self._learn_topic,
                now_ms=self._clock.now_ms,
                system_clock=type(self._clock) is SystemClock,  # the kernel then reads that clock itself
                store_host=self._store_host_b,
                id_prefix=self._id_prefix,
                max_body=self._max_body,
                max_record=self._max_record,
                index_unique=opts.index_unique_id,
                last_ts=self.recovery.last_store_ts,
            )
        except BaseException:
            self._release_files()
            raise
        self._retention = Retention(self, opts)
        self._appender.bind(
            lock=self._put_lock,
            retention=self._retention,
            check_writable=self._check_writable,
            provide=self._provide,
            make_room=self._make_room,
            drain=self.drain_index,
            index_batch=self._index_batch,
            closed_message=f"store {self.dir} is closed",
        )
        self._closed = False
        # Queues and index hold what recovery re-dispatched, not flushed yet: vouch for them only
        # up to where they were durable; the flush thread's first round moves this on.
        recovery = self.recovery
        self._write_checkpoint(min(recovery.consume_queue_from, recovery.index_from, self._cl.wrote),
                               self._appender.last_ts)

        self._group = GroupCommit(self._cl, opts.sync_flush_timeout_ms) if self._sync else None
        self._allow_direct()
        self._flusher = FlushService(
            self._cl,
            flush_commit_log=not self._sync,
            interval_ms=opts.flush_interval_ms,
            least_pages=opts.flush_least_pages,
            thorough_interval_ms=opts.flush_thorough_interval_ms,
            derived_interval_ms=opts.derived_flush_interval_ms,
            flush_derived=self._flush_derived,
            housekeeping=self._housekeeping,
            catch_up=self._cl.flushed < self._cl.wrote,
        )
        self._flusher.start()

    # -- appending ----------------------------------------------------------------------------

    def _learn_topic(self, topic: str) -> tuple[bytes, bytes, int]:
        """The cached record parts of a topic seen for the first time. Topic names become
        directory names: checked here, before anything is written, even though AppendRequest
        validated them (a request can be altered after validation)."""
        validate_topic(topic)
        prefix = topic_part(topic)
        bare = build_tail(prefix, b"")
        known = self._topics[topic] = (prefix, bare, zlib.crc32(bare))
        return known

    def _provide(self, appender: Appender) -> None:
        """Under the put lock: cross the file boundary the append kernel stopped at."""
        need = appender.need
        if need == NEED_ROLL:
            self._cl.reserve(appender.need_size)
        elif need == NEED_ALLOCATE:
            seg = self._cl.cur
            assert seg is not None
            self._cl.allocate(seg, appender.need_size)  # StoreFullError before the record is written
        elif need == NEED_CQ_FILE:
            appender.need_cq.prepare(appender.need_qoff)  # the entry's file and blocks (StoreFullError)
        elif need == NEED_QUEUE:
            topic = appender.need_topic
            assert topic is not None
            self._cqs.create(topic, appender.need_qid)
        else:
            raise StoreError(f"store_mmap append kernel stopped without a reason (need={need}); please report this")

    def _make_room(self, counts: dict[tuple[str, int], int], sizes: list[int]) -> None:
        """Under the put lock, before a batch writes anything: every commit-log segment and
        consume-queue file it will write into exists and has its blocks (``counts``: records per
        queue, ``sizes``: each record's bytes), so a full disk refuses the whole batch
        (StoreFullError) instead of storing part of it."""
        self._cl.ensure_room(sizes)
        for (topic, queue_id), count in counts.items():
            cq = self._cqs.queues.get((topic, queue_id)) or self._cqs.create(topic, queue_id)
            cq.prepare(cq.max_offset, count)

    def prepare_queue(self, topic: str, queue_id: int) -> None:
        """Make the file (and blocks) the queue's next entry goes to now (QueuePreparing)."""
        with self._put_lock:
            cq = self._cqs.queues.get((topic, queue_id)) or self._cqs.create(topic, queue_id)
            cq.prepare(cq.max_offset)

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.dir} is closed")
        self._retention.check_disk()

    def append(self, request: AppendRequest) -> AppendResult:
        result = self._appender.append(request)
        if not self._published(result.commit_log_offset + result.size):
            result = attrs.evolve(result, status=FLUSH_DISK_TIMEOUT)
        return result

    def _published(self, end: int) -> bool:
        """Records up to log offset ``end`` were appended: the log listener hears of them before
        the flush wait (shipping overlaps it); False when a sync flush did not reach them in time."""
        if self._log_listener is not None:
            self._log_listener(end)
        group = self._group
        return group is None or group.wait(end)

    def _allow_direct(self) -> None:
        """Under the put lock (or while opening): the direct append is taken only while
        ``_published`` does nothing - no log listener, no sync-flush group - so log shipping
        and flush waits are never skipped."""
        self._appender.direct = self._log_listener is None and self._group is None

    def set_log_listener(self, listener: Callable[[int], None] | None) -> None:
        # under the put lock: a direct append that waited for it sees the listener and declines
        with self._put_lock:
            self._log_listener = listener
            self._allow_direct()

    def direct_append(self) -> object | None:
        """The DirectAppending capability: the compiled kernel's direct append (a PyCapsule; it
        declines, per call, while a log listener is set), or None for a sync flush or the
        Python kernel."""
        appender = self._appender
        if self._group is not None or isinstance(appender, PyAppender):
            return None
        capsule: object = appender.direct_capsule()
        return capsule

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """The whole batch is encoded in one pass (every request is checked before any is
        written), its disk blocks are allocated, then it is written: records straight into the
        mapped segment, entries into the mapped consume queues, index entries into one pending
        buffer. Requests may name any topics and queues; queue offsets are consecutive per
        queue, in request order."""
        results = self._appender.append_batch(requests)
        if results and not self._published(results[-1].commit_log_offset + results[-1].size):
            results = [attrs.evolve(r, status=FLUSH_DISK_TIMEOUT) for r in results]
        return results

    def append_columns(self, requests: Sequence[AppendRequest]) -> AppendColumns:
        """``append_batch`` with its results as columns (ColumnAppending): no AppendResult is built
        until one is read."""
        raw, ts = self._appender.append_columns(requests)
        results = AppendColumns(memoryview(raw).cast("q"), self._id_prefix, ts)
        if results and not self._published(results.end_offset):
            results = results.with_status(FLUSH_DISK_TIMEOUT)
        return results

    # -- index dispatch -----------------------------------------------------------------------

    def drain_index(self) -> int:
        """Index every noted key; returns the commit-log offset the index now covers.

        Never raises for a full disk (it runs after appends were acknowledged): the keys stay
        queued, the checkpoint keeps the older index offset, and the next drain tries again."""
        appender = self._appender
        with self._index.lock:
            with self._put_lock:
                replicated, self._unindexed = self._unindexed, []
                retry, self._index_retry = self._index_retry, []
                taken = appender.take_pending()
                upto = self._cl.wrote
            parts = [*retry, key_entries(replicated), appender.pending_entries(taken)]  # commit-log order
            hashes, offsets, stamps = (np.concatenate([part[k] for part in parts]) for k in range(3))
            entries = (hashes, offsets, stamps)
            try:
                self._index.add_arrays(*entries)
            except StoreFullError as exc:
                with self._put_lock:
                    self._index_retry.insert(0, entries)  # duplicates of entries already added are harmless
                if self._index_full_logged + 60_000 <= self._now_ms():
                    self._index_full_logged = self._now_ms()
                    log.warning("key index cannot grow: disk full; keys stay queued",
                                queued=int(entries[0].size) + appender.pending_count, error=str(exc))
                return self._index.indexed_upto
            self._index.indexed_upto = upto
        return upto

    # -- reading ------------------------------------------------------------------------------

    def read(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        if self._closed or commit_log_offset < 0:
            return None
        rec = self._cl.read(commit_log_offset)  # the size hint is not needed: records carry theirs
        return None if rec is None else rec.to_stored(rec.total)

    def read_many(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        """BulkReading: the records of a run of entries decoded in one kernel call (``read`` each)."""
        if self._closed:
            return [None] * len(entries)
        return self._cl.read_many([entry.commit_log_offset for entry in entries], self._scan_kernel)

    def read_queue_run(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[StoredMessage] | None:
        """QueueRunReading: the entries (raw) and their records decoded in one kernel call, no
        ConsumeQueueEntry built; None when an entry's record is not exactly what it says."""
        cq = self._cqs.queues.get((topic, queue_id))
        if cq is None or self._closed:
            return []
        first, entries = cq.run(offset, max_messages)
        return self._cl.read_run(entries, first, queue_id, topic.encode("ascii"), self._scan_kernel)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        cq = self._cqs.queues.get((topic, queue_id))
        if cq is None or self._closed:
            return []
        return cq.read(offset, max_entries, self._entries_of)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.queues.get((topic, queue_id))
        return 0 if cq is None else cq.min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.queues.get((topic, queue_id))
        return 0 if cq is None else cq.max_offset

    def queues(self) -> Mapping[str, int]:
        return self._cqs.topics()

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        try:
            host, offset = decode_msg_id(msg_id)
        except ValidationError:
            return None
        found = self.read(offset)
        # The record's own store host: a slave holds its master's messages under the master's ids.
        return found if found is not None and found.store_host == host else None

    def query_by_key(
        self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[StoredMessage]:
        if self._closed or max_results <= 0:
            return []
        end = (1 << 63) - 1 if end_ms is None else end_ms
        self.drain_index()
        found: dict[int, StoredMessage] = {}
        for phys in self._index.lookup(f"{topic}#{key}", begin_ms, end):
            if phys in found:
                continue
            rec = self._cl.read(phys)
            # Slots and hashes collide: only the message itself can say whether it matches.
            if rec is None or rec.topic != topic or not begin_ms <= rec.store_ts <= end:
                continue
            msg = rec.to_stored(rec.total)
            if key in msg.keys or msg.unique_id == key:
                found[phys] = msg
                if len(found) >= max_results:
                    break
        return [found[p] for p in sorted(found)]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cqs.queues.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            entry = cq.entry(mid)
            ts = None if entry is None else self._cl.store_timestamp(entry[0])
            if ts is None or ts < timestamp_ms:  # an unreadable (expired) record counts as older
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- consume-queue repair -----------------------------------------------------------------

    def repair_queue(self, topic: str, queue_id: int, offset: int) -> bool:
        """The entry at ``offset`` of a queue led to no message, or to another one: check the
        entries around it against the commit log and rebuild the damaged ones from the log.

        Returns True when entries were rewritten (read them again). False when the entry is sound
        but its record is damaged, or the record is gone with it: the message is lost, which is
        logged and counted once (``records_lost``); readers skip it.
        """
        cq = self._cqs.queues.get((topic, queue_id))
        if cq is None or self._closed or not cq.min_offset <= offset < cq.max_offset:
            return False
        known = self._lost_entries.setdefault((topic, queue_id), set())
        if offset in known:
            return False
        lo = max(cq.min_offset, offset - _REPAIR_WINDOW)
        hi = min(cq.max_offset, offset + _REPAIR_WINDOW)
        with self._repair_lock:
            fixed, gone = repair_queue(self._cl, cq, lo, hi, self._cl.wrote, self._scan_kernel,
                                       write=self._under_put_lock)
            self._queue_entries_repaired += fixed
            if offset not in gone and not fixed:
                entry = cq.entry(offset)
                if entry is not None and self._cl.read(entry[0]) is None:
                    gone.append(offset)  # the entry is sound, the record it points at is damaged
                    log.error("damaged commit-log record: its message is lost", topic=topic, queue=queue_id,
                              queue_offset=offset, commit_log_offset=entry[0])
            fresh = [q for q in gone if q not in known]
            known.update(fresh)
            self._records_lost += len(fresh)
        return fixed > 0

    def _under_put_lock(self, write: Callable[[], None]) -> None:
        with self._put_lock:
            write()

    # -- flushing -----------------------------------------------------------------------------

    def _write_checkpoint(self, derived_upto: int, ts: int) -> None:
        self._checkpoint.write(
            CheckpointData(
                commit_log_offset=self._cl.flushed,
                commit_log_ts=ts,
                consume_queue_offset=derived_upto,
                consume_queue_ts=ts,
                index_offset=min(derived_upto, self._index.indexed_upto),
                index_ts=ts,
            )
        )

    def _flush_derived(self, everything: bool = False) -> None:
        """Index pending keys, flush consume queues and index, then record how far they are durable."""
        with self._derived_lock:
            if self._closed and not everything:
                return
            upto = self.drain_index()
            ts = self._appender.last_ts
            for cq in self._cqs:
                cq.flush(everything)
            self._index.flush(everything)
            self._write_checkpoint(upto, ts)

    def flush(self) -> None:
        if self._closed:
            return
        self._cl.flush()
        self._flush_derived()

    def _housekeeping(self) -> None:
        self._retention.refresh()

    # -- retention ----------------------------------------------------------------------------

    def clean_expired(self, now_ms: int) -> int:
        if self._closed:
            return 0
        return self._retention.clean(now_ms)

    # -- admin --------------------------------------------------------------------------------

    @property
    def appends_wait_for_disk(self) -> bool:
        """The FlushMode capability: a sync flush waits for its group commit."""
        return self._group is not None

    def stats(self) -> Mapping[str, float]:
        cl = self._cl
        return {
            "messages_appended": self._appender.messages + self._replicated_messages,
            "bytes_appended": self._appender.appended_bytes + self._replicated_bytes,
            "commit_log_min_offset": cl.min_offset,
            "commit_log_max_offset": cl.wrote,
            "commit_log_flushed_offset": cl.flushed,
            "flushes": cl.flush_count,
            "flush_seconds_total": cl.flush_seconds,
            "group_commit_flushes": self._group.leader_flushes if self._group else 0,
            "flush_disk_timeouts": self._group.timeouts if self._group else 0,
            "segments": len(cl.segments),
            "segment_allocation_waits": cl.allocator.waits,
            "consume_queues": len(self._cqs.queues),
            "index_files": len(self._index.files),
            "index_pending": self._appender.pending_count + len(self._unindexed)
            + sum(int(part[0].size) for part in self._index_retry),
            "disk_used_ratio": self._retention.disk_ratio,
            "files_deleted": self._retention.deleted,
            "retention_forced_segments": self._retention.forced,
            "retention_forced_unconsumed_bytes": self._retention.forced_unconsumed_bytes,
            "retention_held": float(self._retention.held),
            "recovered_redispatched": self.recovery.redispatched,
            "recovered_damaged_bytes": self.recovery.damaged_bytes,
            "recovered_cut_bytes": self.recovery.cut_bytes,
            "recovered_records_cut": self.recovery.records_cut,
            "queue_entries_repaired": self.recovery.queue_entries_repaired + self._queue_entries_repaired,
            "records_lost": self.recovery.queue_entries_lost + self._records_lost,
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # new appends are refused from here on
        self._appender.closed = True
        self._flusher.stop()
        try:
            self._cl.flush()
            self._flush_derived(everything=True)
        finally:
            with self._put_lock:  # an append that got past the check finishes before the unmap
                self._release_files()
            try:
                (self.dir / "abort").unlink()
                fsync_dir(self.dir)
            except FileNotFoundError:
                pass
            os.close(self._lock_fd)
            log.info("store_mmap closed", dir=str(self.dir), end=self._cl.wrote)

    def _release_files(self) -> None:
        appender = getattr(self, "_appender", None)
        if appender is not None:
            appender.release()  # it keeps buffers of the current files between appends
        self._cl.close()
        self._cqs.close()
        self._index.close()
        self._checkpoint.close()

    # -- internals used by retention ----------------------------------------------------------

    @property
    def commit_log(self) -> CommitLog:
        return self._cl

    @property
    def consume_queues(self) -> ConsumeQueues:
        return self._cqs

    @property
    def index(self) -> IndexService:
        return self._index

    @property
    def put_lock(self) -> threading.Lock:
        return self._put_lock

    def __repr__(self) -> str:
        return f"MmapMessageStore({str(self.dir)!r}, end={self._cl.wrote})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

