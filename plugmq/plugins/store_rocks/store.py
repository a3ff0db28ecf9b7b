"""MessageStore on RocksDB (rocksdict, raw mode): five column families, one WriteBatch per group.

===========  ========================================  ==========================================
column fam.  key                                       value
===========  ========================================  ==========================================
msg          commit-log offset (8 B big-endian)        the record (codec.py), CRC-protected
cq           topic | queue id | queue offset (BE)      20-byte entry offset:int64|size:int32|tag:int64
idx          topic | key | store ts | offset           empty (the key is the entry)
queues       topic | queue id                          min offset, max offset
meta         b"state"                                  next commit-log offset, last store timestamp
===========  ========================================  ==========================================

The commit-log offset is a byte position (the sum of the sizes of the records before it), like
RocketMQ's physical offset, and is never reused. A message, its consume-queue and index entries
and the queue state go in one atomic WriteBatch; RocksDB's WAL replay (point-in-time mode) keeps
whole batches or drops them, so a crash never leaves a queue entry without its record. Retention
and tail cuts use ``delete_range`` (one tombstone for a run of records) where keys are contiguous.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog
from rocksdict import (
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ConsumeQueueEntry,
    CorruptRecordError,
    PluginContext,
    StoreCapabilities,
    StoredMessage,
    StoreError,
    decode_msg_id,
    encode_msg_id,
    validate_topic,
)
from plugmq.core.kvstore import codec
from plugmq.core.kvstore.groupcommit import GroupCommit
from plugmq.plugins.store_rocks.options import RocksOptions

log = structlog.stdlib.get_logger(__name__)

CAPABILITIES = StoreCapabilities(
    sync_flush=True, async_flush=True, query_by_key=True, query_by_time=True, crash_recovery=True,
    retention=True, concurrent_writers=True,
)
_FAMILIES = ("msg", "cq", "idx", "queues", "meta")
_STATE_KEY = b"state"
_MAX_U64 = (1 << 64) - 1
_PAST_ALL_OFFSETS = b"\xff" * 9  # sorts after every 8-byte offset key


def _db_options(options: RocksOptions) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    opts.set_write_buffer_size(options.write_buffer_size)
    opts.set_compression_type(getattr(DBCompressionType, options.compression)())
    opts.set_keep_log_file_num(4)
    return opts


class RocksStore:
    """The store_rocks MessageStore (see the module docstring for the layout)."""

    capabilities = CAPABILITIES

    def __init__(self, context: PluginContext, options: RocksOptions, *, plugin_name: str = "store_rocks") -> None:
        self._options = options
        self._clock = context.clock
        self._store_host = context.store_host
        self._id_prefix = encode_msg_id(context.store_host, 0)[:16]
        self._max_body = context.max_message_size
        root = Path(context.plugin_dir(plugin_name))
        self._dir = root / "db"
        self._log = log.bind(store=str(self._dir), flush=options.flush)
        self._lock_fd = _lock_directory(root)
        db_opts = _db_options(options)
        try:
            self._db = Rdict(str(self._dir), db_opts, column_families={name: _db_options(options) for name in _FAMILIES})
        except Exception as exc:  # rocksdict raises plain Exception for engine errors
            os.close(self._lock_fd)
            raise StoreError(f"cannot open RocksDB in {self._dir}: {exc}") from exc
        self._cf = {name: self._db.get_column_family(name) for name in _FAMILIES}
        self._handle = {name: self._db.get_column_family_handle(name) for name in _FAMILIES}
        self._write_opts = WriteOptions()
        self._write_opts.sync = options.flush == "sync"
        self._write_opts.disable_wal = options.disable_wal
        self._commit = GroupCommit(self._commit_groups)
        self._queues: dict[bytes, list[int]] = {}
        self._next_offset = 0
        self._last_ts = 0
        self._closed = False
        self._stats = {"messages": 0.0, "bytes": 0.0, "corrupt_records": 0.0, "flushes": 0.0,
                       "truncated_records": 0.0, "expired_records": 0.0}
        self._recover()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if options.flush == "async":
            self._flusher = threading.Thread(target=self._flush_loop, name="store_rocks-flush", daemon=True)
            self._flusher.start()

    # ------------------------------------------------------------------------------------------
    # appends
    # ------------------------------------------------------------------------------------------

    def append(self, request: AppendRequest) -> AppendResult:
        return self.append_batch([request])[0]

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        if self._closed:
            raise StoreError("store_rocks is closed; open a new store to append")
        if not requests:
            return []
        # Everything that can refuse the batch happens before the write lock: nothing half-written.
        prepared = []
        for request in requests:
            validate_topic(request.topic)
            prepared.append(codec.prepare(request, self._store_host, self._max_body))
        return self._commit.submit(prepared)

    def _commit_groups(self, batches: list[Sequence[codec.Prepared]]) -> list[list[AppendResult]]:
        offset = self._next_offset
        store_ts = max(self._clock.now_ms(), self._last_ts)  # never backwards: time search stays sound
        next_q: dict[bytes, int] = {}
        wb = WriteBatch(raw_mode=True)
        msg_cf, cq_cf, idx_cf = self._handle["msg"], self._handle["cq"], self._handle["idx"]
        outcome: list[list[AppendResult]] = []
        count = written = 0
        for batch in batches:
            results = []
            for p in batch:
                qkey = p.queue_key
                qoff = next_q.get(qkey)
                if qoff is None:
                    state = self._queues.get(qkey)
                    qoff = state[1] if state else 0
                wb.put(codec.OFFSET.pack(offset), codec.encode_record(p, qoff, offset, store_ts), msg_cf)
                wb.put(codec.cq_key(qkey, qoff), codec.CQ_ENTRY.pack(offset, p.size, p.request.tags_code), cq_cf)
                for prefix in p.index_keys:
                    wb.put(codec.index_key(prefix, store_ts, offset), b"", idx_cf)
                results.append(AppendResult(
                    status=AppendStatus.PUT_OK, msg_id=f"{self._id_prefix}{offset:016X}", queue_offset=qoff,
                    commit_log_offset=offset, size=p.size, store_timestamp_ms=store_ts,
                ))
                next_q[qkey] = qoff + 1
                offset += p.size
                written += p.size
                count += 1
            outcome.append(results)
        q_cf = self._handle["queues"]
        for k, v in next_q.items():
            wb.put(k, codec.QUEUE_STATE.pack(self._queues[k][0] if k in self._queues else 0, v), q_cf)
        wb.put(_STATE_KEY, codec.STORE_STATE.pack(offset, store_ts), self._handle["meta"])
        self._write(wb)
        self._next_offset = offset
        self._last_ts = store_ts
        for k, v in next_q.items():
            state = self._queues.get(k)
            if state is None:
                self._queues[k] = [0, v]
            else:
                state[1] = v
        self._stats["messages"] += count
        self._stats["bytes"] += written
        return outcome

    def _write(self, wb: WriteBatch) -> None:
        try:
            self._db.write(wb, self._write_opts)
        except Exception as exc:  # rocksdict raises plain Exception for engine errors
            raise StoreError(f"RocksDB write failed in {self._dir}: {exc}") from exc

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("store_rocks is closed")

    def _get(self, family: str, key: bytes) -> bytes | None:
        try:
            return self._cf[family].get(key)
        except Exception as exc:  # a damaged block surfaces as an engine error: no record, logged
            self._stats["corrupt_records"] += 1
            self._log.error("rocksdb read failed", family=family, key=key.hex(), reason=str(exc))
            return None

    def _decode(self, raw: bytes, offset: int) -> StoredMessage | None:
        try:
            message = codec.decode_record(raw)
        except CorruptRecordError as exc:
            self._stats["corrupt_records"] += 1
            self._log.error("corrupt record skipped", commit_log_offset=offset, reason=str(exc))
            return None
        if message.commit_log_offset != offset:
            self._stats["corrupt_records"] += 1
            self._log.error("record stored under the wrong offset", key=offset, inside=message.commit_log_offset)
            return None
        return message

    def read(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        self._check_open()
        if not 0 <= commit_log_offset <= _MAX_U64:
            return None
        raw = self._get("msg", codec.OFFSET.pack(commit_log_offset))
        return None if raw is None else self._decode(raw, commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        self._check_open()
        if max_entries <= 0 or not 0 <= queue_id <= 0xFFFF_FFFF:
            return []
        prefix = codec.queue_prefix(topic, queue_id)
        # Entries become readable when the batch is written, the in-memory max a moment later:
        # never show an entry max_offset does not count yet, or a reader's next offset is "illegal".
        state = self._queues.get(prefix)
        published = state[1] if state else 0
        max_entries = min(max_entries, published - max(offset, 0))
        if max_entries <= 0:
            return []
        plen = len(prefix)
        read_opts = ReadOptions()
        read_opts.set_iterate_upper_bound(prefix + b"\xff" * 8 + b"\x00")
        it = self._cf["cq"].iter(read_opts)
        it.seek(codec.cq_key(prefix, max(offset, 0)))
        entries: list[ConsumeQueueEntry] = []
        while it.valid() and len(entries) < max_entries:
            key = it.key()
            if not key.startswith(prefix):
                break
            clo, size, tags = codec.CQ_ENTRY.unpack(it.value())
            entries.append(ConsumeQueueEntry(codec.OFFSET.unpack_from(key, plen)[0], clo, size, tags))
            it.next()
        del it
        return entries

    def min_offset(self, topic: str, queue_id: int) -> int:
        state = self._queues.get(codec.queue_prefix(topic, queue_id)) if 0 <= queue_id <= 0xFFFF_FFFF else None
        return state[0] if state else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        state = self._queues.get(codec.queue_prefix(topic, queue_id)) if 0 <= queue_id <= 0xFFFF_FFFF else None
        return state[1] if state else 0

    def queues(self) -> Mapping[str, int]:
        found: dict[str, int] = {}
        for key in list(self._queues):
            topic, queue_id = codec.split_queue_key(key)
            found[topic] = max(found.get(topic, 0), queue_id + 1)
        return found

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        host, offset = decode_msg_id(msg_id)
        message = self.read(offset)
        if message is None or message.store_host != host:
            return None
        return message

    def query_by_key(
        self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[StoredMessage]:
        """Newest first, like RocketMQ's index walk; entries are re-checked against the record."""
        self._check_open()
        if max_results <= 0 or not key:
            return []
        prefix = codec.index_prefix(topic, key)
        plen = len(prefix)
        end = _MAX_U64 if end_ms is None else min(end_ms, _MAX_U64)
        if end < max(begin_ms, 0):
            return []
        found: list[StoredMessage] = []
        seen: set[int] = set()
        it = self._cf["idx"].iter(ReadOptions())
        it.seek_for_prev(codec.index_key(prefix, end, _MAX_U64))
        while it.valid() and len(found) < max_results:
            k = it.key()
            if not k.startswith(prefix) or len(k) != plen + 16:
                break
            store_ts, offset = codec.split_index_key(k, plen)
            if store_ts < begin_ms:
                break
            it.prev()
            if offset in seen:
                continue
            seen.add(offset)
            raw = self._get("msg", codec.OFFSET.pack(offset))
            message = None if raw is None else self._decode(raw, offset)
            # Stale entries (record cut or expired) simply do not match any more.
            if (message is not None and message.topic == topic and message.store_timestamp_ms == store_ts
                    and codec.has_key(message, key)):
                found.append(message)
        del it
        return found

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Binary search over the queue: store times never decrease along a queue."""
        self._check_open()
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        prefix = codec.queue_prefix(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self._get("cq", codec.cq_key(prefix, mid))
            stamp = None
            if entry is not None:
                stamp = self._store_ts(self._get("msg", codec.OFFSET.pack(codec.CQ_ENTRY.unpack(entry)[0])))
            if stamp is None or stamp < timestamp_ms:  # an unreadable record cannot be an answer
                lo = mid + 1
            else:
                hi = mid
        return lo

    @staticmethod
    def _store_ts(raw: bytes | None) -> int | None:
        if raw is None:
            return None
        try:
            return codec.decode_header(raw).store_ts
        except CorruptRecordError:
            return None

    # ------------------------------------------------------------------------------------------
    # durability, retention, recovery
    # ------------------------------------------------------------------------------------------

    def flush(self) -> None:
        if self._closed:
            return
        try:
            if self._options.disable_wal:
                for family in self._cf.values():
                    family.flush(True)
            else:
                self._db.flush_wal(True)
        except Exception as exc:
            raise StoreError(f"RocksDB flush failed in {self._dir}: {exc}") from exc
        self._stats["flushes"] += 1

    def _flush_loop(self) -> None:
        interval = self._options.flush_interval_ms / 1000.0
        while not self._clock.wait(self._stop, interval):
            try:
                self.flush()
            except Exception:  # the flusher must outlive one failed sync; the next one retries
                self._log.exception("background rocksdb flush failed")

    def clean_expired(self, now_ms: int) -> int:
        """Delete messages stored more than ``file_reserved_hours`` before ``now_ms``.

        Returns how many message records were removed (RocksDB has no segment files to count).
        """
        self._check_open()
        cutoff = now_ms - int(self._options.file_reserved_hours * 3_600_000)
        removed = 0
        while True:
            with self._commit.exclusive():
                count, more = self._clean_chunk(cutoff)
            removed += count
            if not more:
                break
        if removed:
            self._stats["expired_records"] += removed
            self._log.info("expired messages removed", count=removed, cutoff_ms=cutoff)
        return removed

    def _clean_chunk(self, cutoff: int) -> tuple[int, bool]:
        doomed: list[bytes] = []
        undecodable: list[bytes] = []
        wb = WriteBatch(raw_mode=True)
        new_min: dict[bytes, int] = {}
        more = False
        it = self._cf["msg"].iter(ReadOptions())
        it.seek_to_first()
        while it.valid():
            if len(doomed) + len(undecodable) >= self._options.retention_batch:
                more = bool(doomed)
                break
            key = it.key()
            try:
                message = codec.decode_record(it.value())
            except CorruptRecordError:
                # Its age is unknown: it goes only if an expired record follows it.
                undecodable.append(key)
                it.next()
                continue
            if message.store_timestamp_ms >= cutoff:
                break
            doomed.extend(undecodable)
            undecodable.clear()
            doomed.append(key)
            for index_key in codec.index_keys_of(message):
                wb.delete(index_key, self._handle["idx"])
            qkey = codec.queue_prefix(message.topic, message.queue_id)
            new_min[qkey] = max(new_min.get(qkey, 0), message.queue_offset + 1)
            it.next()
        del it
        if not doomed:
            return 0, False
        # The doomed records are the first ones of the log, contiguous: one range tombstone.
        wb.delete_range(doomed[0], codec.OFFSET.pack(codec.OFFSET.unpack(doomed[-1])[0] + 1), self._handle["msg"])
        q_new: dict[bytes, int] = {}
        for qkey, low in new_min.items():
            state = self._queues[qkey]
            new_low = max(state[0], min(low, state[1]))
            wb.delete_range(codec.cq_key(qkey, 0), codec.cq_key(qkey, new_low), self._handle["cq"])
            wb.put(qkey, codec.QUEUE_STATE.pack(new_low, state[1]), self._handle["queues"])
            q_new[qkey] = new_low
        self._write(wb)
        for qkey, low in q_new.items():
            self._queues[qkey][0] = low
        return len(doomed), more

    def _recover(self) -> None:
        state = self._get("meta", _STATE_KEY)
        if state is not None:
            self._next_offset, self._last_ts = codec.STORE_STATE.unpack(state)
        for key, value in self._cf["queues"].items():
            self._queues[bytes(key)] = list(codec.QUEUE_STATE.unpack(value))
        it = self._cf["msg"].iter(ReadOptions())
        it.seek_to_last()
        if it.valid():
            self._next_offset = max(self._next_offset, codec.OFFSET.unpack(it.key())[0] + len(it.value()))
        del it
        first_bad = self._verify_tail()
        if first_bad is not None:
            self._truncate(first_bad)
        self._log.info("store_rocks opened", next_offset=self._next_offset, queues=len(self._queues))

    def _verify_tail(self) -> int | None:
        """CRC-check the newest records of every queue; the smallest damaged offset, if any.

        Driven by the consume queues and point reads rather than by iterating the log: a damaged
        SST block ends an iterator early, so iteration would miss exactly what it looks for.
        """
        window = max(0, self._next_offset - self._options.verify_tail_bytes)
        first_bad: int | None = None
        for qkey, (low, high) in list(self._queues.items()):
            checked = 0
            queue_offset = high - 1
            while queue_offset >= low and checked < self._options.verify_tail_records:
                entry = self._get("cq", codec.cq_key(qkey, queue_offset))
                if entry is None:
                    break
                offset = codec.CQ_ENTRY.unpack(entry)[0]
                if offset < window:
                    break
                checked += 1
                queue_offset -= 1
                raw = self._get("msg", codec.OFFSET.pack(offset))
                try:
                    if raw is None:
                        raise CorruptRecordError("record missing or unreadable")
                    message = codec.decode_record(raw)
                    if message.commit_log_offset != offset:
                        raise CorruptRecordError("record stored under the wrong offset")
                    self._last_ts = max(self._last_ts, message.store_timestamp_ms)
                except CorruptRecordError as exc:
                    self._log.error("damaged record in the log tail", commit_log_offset=offset, reason=str(exc))
                    first_bad = offset if first_bad is None else min(first_bad, offset)
        return first_bad

    def _truncate(self, cut: int) -> None:
        """Remove every record at or after ``cut``, with its consume-queue and index entries."""
        wb = WriteBatch(raw_mode=True)
        count = 0
        it = self._cf["msg"].iter(ReadOptions())
        it.seek(codec.OFFSET.pack(cut))
        while it.valid():
            count += 1
            try:
                for index_key in codec.index_keys_of(codec.decode_record(it.value())):
                    wb.delete(index_key, self._handle["idx"])
            except CorruptRecordError:
                pass  # its index entries stay behind; queries re-check and skip them
            it.next()
        del it
        wb.delete_range(codec.OFFSET.pack(cut), _PAST_ALL_OFFSETS, self._handle["msg"])
        q_new: dict[bytes, list[int]] = {}
        for qkey, (low, high) in self._queues.items():
            new_high = high
            while new_high > low:
                entry = self._get("cq", codec.cq_key(qkey, new_high - 1))
                if entry is None or codec.CQ_ENTRY.unpack(entry)[0] < cut:
                    break
                new_high -= 1
            if new_high != high:
                wb.delete_range(codec.cq_key(qkey, new_high), codec.cq_key(qkey, high), self._handle["cq"])
                q_new[qkey] = [min(low, new_high), new_high]
                wb.put(qkey, codec.QUEUE_STATE.pack(*q_new[qkey]), self._handle["queues"])
        write_opts = WriteOptions()
        write_opts.sync = True
        try:
            self._db.write(wb, write_opts)
        except Exception as exc:
            raise StoreError(f"cutting the damaged log tail in {self._dir} failed: {exc}") from exc
        self._queues.update(q_new)
        self._stats["truncated_records"] += count
        self._log.warning("log tail cut", cut_offset=cut, records=count, queues=len(q_new))

    # ------------------------------------------------------------------------------------------

    def stats(self) -> Mapping[str, float]:
        out = dict(self._stats)
        out["group_commits"] = float(self._commit.groups)
        out["next_commit_log_offset"] = float(self._next_offset)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._commit.exclusive():
            try:
                self.flush()
            finally:
                self._closed = True
                # Column-family objects keep RocksDB alive; drop them before the DB itself.
                self._cf.clear()
                self._handle.clear()
                self._db.close()  # rocksdict flushes the memtables to SST files on the way out
                del self._db
                os.close(self._lock_fd)
        self._log.info("store_rocks closed")


def _lock_directory(path: Path) -> int:
    """One store per directory: a second opener (this process or another) is refused."""
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(
            f"{path} is already open by another store (a running broker or process); close it first"
        ) from None
    return fd
