"""MessageStore on LMDB: one environment, five named databases, one write transaction per group.

=========  ==========================================  ==========================================
database   key                                         value
=========  ==========================================  ==========================================
msg        commit-log offset (8 B big-endian)          the record (codec.py), CRC-protected
cq         topic | queue id | queue offset (BE)        20-byte entry offset:int64|size:int32|tag:int64
idx        topic | key | store ts | offset             empty (the key is the entry)
queues     topic | queue id                            min offset, max offset
meta       b"state"                                    next commit-log offset, last store timestamp
=========  ==========================================  ==========================================

The commit-log offset is a byte position (the sum of the sizes of the records before it), like
RocketMQ's physical offset, and is never reused, even after the tail is cut. A message, its
consume-queue entry, its index entries and the queue state go in the same transaction, so a
crash leaves all of them or none (LMDB's copy-on-write B-tree never exposes a half commit).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import lmdb
import structlog

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
    StoreFullError,
    decode_msg_id,
    encode_msg_id,
    validate_topic,
)
from plugmq.core.kvstore import codec
from plugmq.core.kvstore.groupcommit import GroupCommit
from plugmq.plugins.store_lmdb.options import LmdbOptions

log = structlog.stdlib.get_logger(__name__)

CAPABILITIES = StoreCapabilities(
    sync_flush=True, async_flush=True, query_by_key=True, query_by_time=True, crash_recovery=True,
    retention=True, concurrent_writers=True,
)
_STATE_KEY = b"state"
_MAX_U64 = (1 << 64) - 1


class _ReadGate:
    """Readers share it; map growth takes it alone (LMDB forbids set_mapsize under a live txn)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class LmdbStore:
    """The store_lmdb MessageStore (see the module docstring for the layout)."""

    capabilities = CAPABILITIES

    def __init__(self, context: PluginContext, options: LmdbOptions, *, plugin_name: str = "store_lmdb") -> None:
        self._options = options
        self._clock = context.clock
        self._store_host = context.store_host
        self._id_prefix = encode_msg_id(context.store_host, 0)[:16]
        self._max_body = context.max_message_size
        self._dir = Path(context.plugin_dir(plugin_name))
        self._log = log.bind(store=str(self._dir), flush=options.flush)
        self._lock_fd = _lock_directory(self._dir)
        sync = options.flush == "sync"
        try:
            self._env = lmdb.open(
                str(self._dir), map_size=options.map_size, max_dbs=5, subdir=True, sync=sync, metasync=sync,
                writemap=options.writemap, map_async=False, readahead=False, max_readers=options.max_readers,
                lock=True,
            )
        except lmdb.Error as exc:
            os.close(self._lock_fd)
            raise StoreError(f"cannot open LMDB environment in {self._dir}: {exc}") from exc
        # A map grown in an earlier run stays that size; keep our notion of it in step.
        self._map_size = max(options.map_size, self._env.info()["map_size"])
        self._msg = self._env.open_db(b"msg")
        self._cq = self._env.open_db(b"cq")
        self._idx = self._env.open_db(b"idx")
        self._qstate = self._env.open_db(b"queues")
        self._meta = self._env.open_db(b"meta")
        self._gate = _ReadGate()
        self._commit = GroupCommit(self._commit_groups)
        self._queues: dict[bytes, list[int]] = {}
        self._next_offset = 0
        self._last_ts = 0
        self._closed = False
        self._stats = {"messages": 0.0, "bytes": 0.0, "map_grows": 0.0, "corrupt_records": 0.0,
                       "flushes": 0.0, "truncated_records": 0.0, "expired_records": 0.0}
        self._recover()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if not sync:
            self._flusher = threading.Thread(target=self._flush_loop, name="store_lmdb-flush", daemon=True)
            self._flusher.start()

    # ------------------------------------------------------------------------------------------
    # appends
    # ------------------------------------------------------------------------------------------

    def append(self, request: AppendRequest) -> AppendResult:
        return self.append_batch([request])[0]

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        if self._closed:
            raise StoreError("store_lmdb is closed; open a new store to append")
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
        msg_puts: list[tuple[bytes, bytes]] = []
        cq_puts: list[tuple[bytes, bytes]] = []
        idx_puts: list[tuple[bytes, bytes]] = []
        outcome: list[list[AppendResult]] = []
        written = 0
        for batch in batches:
            results = []
            for p in batch:
                qkey = p.queue_key
                qoff = next_q.get(qkey)
                if qoff is None:
                    state = self._queues.get(qkey)
                    qoff = state[1] if state else 0
                record = codec.encode_record(p, qoff, offset, store_ts)
                msg_puts.append((codec.OFFSET.pack(offset), record))
                cq_puts.append((codec.cq_key(qkey, qoff), codec.CQ_ENTRY.pack(offset, p.size, p.request.tags_code)))
                for prefix in p.index_keys:
                    idx_puts.append((codec.index_key(prefix, store_ts, offset), b""))
                results.append(AppendResult(
                    status=AppendStatus.PUT_OK, msg_id=f"{self._id_prefix}{offset:016X}", queue_offset=qoff,
                    commit_log_offset=offset, size=p.size, store_timestamp_ms=store_ts,
                ))
                next_q[qkey] = qoff + 1
                offset += p.size
                written += p.size
            outcome.append(results)
        q_puts = [(k, codec.QUEUE_STATE.pack(self._queues[k][0] if k in self._queues else 0, v))
                  for k, v in next_q.items()]

        def apply(txn: lmdb.Transaction) -> None:
            # Offsets only grow, so MDB_APPEND skips the B-tree search; a refused key is a bug.
            _consumed, added = txn.cursor(self._msg).putmulti(msg_puts, append=True)
            if added != len(msg_puts):
                raise StoreError(f"commit-log offset already used near {msg_puts[0][0].hex()}; store state is inconsistent")
            txn.cursor(self._cq).putmulti(cq_puts)
            if idx_puts:
                txn.cursor(self._idx).putmulti(idx_puts)
            txn.cursor(self._qstate).putmulti(q_puts)
            txn.put(_STATE_KEY, codec.STORE_STATE.pack(offset, store_ts), db=self._meta)

        self._write(apply)
        self._next_offset = offset
        self._last_ts = store_ts
        for k, v in next_q.items():
            state = self._queues.get(k)
            if state is None:
                self._queues[k] = [0, v]
            else:
                state[1] = v
        self._stats["messages"] += len(msg_puts)
        self._stats["bytes"] += written
        return outcome

    def _write(self, apply: Callable[[lmdb.Transaction], None]) -> None:
        """Run ``apply`` in one write txn; on MapFullError grow the map and redo the same txn."""
        while True:
            txn = self._env.begin(write=True)
            try:
                apply(txn)
                txn.commit()
                return
            except lmdb.MapFullError:
                txn.abort()
                self._grow_map()
            except lmdb.Error as exc:
                txn.abort()
                raise StoreError(f"LMDB write failed in {self._dir}: {exc}") from exc
            except BaseException:
                txn.abort()
                raise

    def _grow_map(self) -> None:
        if self._map_size >= self._options.max_map_size:
            raise StoreFullError(
                f"store_lmdb map in {self._dir} is full at max_map_size={self._options.max_map_size} bytes; "
                "raise max_map_size or lower file_reserved_hours"
            )
        new_size = min(self._map_size * 2, self._options.max_map_size)
        with self._gate.exclusive():
            self._env.set_mapsize(new_size)
        self._log.info("lmdb map grown", old=self._map_size, new=new_size)
        self._map_size = new_size
        self._stats["map_grows"] += 1

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    @contextmanager
    def _reading(self, db: object) -> Iterator[lmdb.Transaction]:
        if self._closed:
            raise StoreError("store_lmdb is closed")
        with self._gate.shared(), self._env.begin(db=db) as txn:
            yield txn

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
        if not 0 <= commit_log_offset <= _MAX_U64:
            return None
        with self._reading(self._msg) as txn:
            raw = txn.get(codec.OFFSET.pack(commit_log_offset))
        return None if raw is None else self._decode(raw, commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        if max_entries <= 0 or not 0 <= queue_id <= 0xFFFF_FFFF:
            return []
        prefix = codec.queue_prefix(topic, queue_id)
        # Entries become readable when the engine commits, the in-memory max a moment later:
        # never show an entry max_offset does not count yet, or a reader's next offset is "illegal".
        state = self._queues.get(prefix)
        published = state[1] if state else 0
        max_entries = min(max_entries, published - max(offset, 0))
        if max_entries <= 0:
            return []
        entries: list[ConsumeQueueEntry] = []
        plen = len(prefix)
        with self._reading(self._cq) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(codec.cq_key(prefix, max(offset, 0))):
                return entries
            for key, value in cursor:
                if not key.startswith(prefix) or len(entries) >= max_entries:
                    break
                clo, size, tags = codec.CQ_ENTRY.unpack(value)
                entries.append(ConsumeQueueEntry(codec.OFFSET.unpack_from(key, plen)[0], clo, size, tags))
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
        if max_results <= 0 or not key:
            return []
        prefix = codec.index_prefix(topic, key)
        plen = len(prefix)
        end = _MAX_U64 if end_ms is None else max(end_ms, -1)
        if end < max(begin_ms, 0):
            return []
        found: list[StoredMessage] = []
        seen: set[int] = set()
        with self._reading(self._idx) as txn:
            cursor = txn.cursor()
            upper = prefix + codec.OFFSET.pack(end + 1) if end < _MAX_U64 else prefix + b"\xff" * 17
            ok = cursor.prev() if cursor.set_range(upper) else cursor.last()
            while ok and len(found) < max_results:
                k = cursor.key()
                if not k.startswith(prefix) or len(k) != plen + 16:
                    break
                store_ts, offset = codec.split_index_key(k, plen)
                if store_ts < begin_ms:
                    break
                ok = cursor.prev()
                if offset in seen:
                    continue
                seen.add(offset)
                raw = txn.get(codec.OFFSET.pack(offset), db=self._msg)
                message = None if raw is None else self._decode(raw, offset)
                # Stale entries (record cut or expired) simply do not match any more.
                if (message is not None and message.topic == topic and message.store_timestamp_ms == store_ts
                        and codec.has_key(message, key)):
                    found.append(message)
        return found

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Binary search over the queue: store times never decrease along a queue."""
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        prefix = codec.queue_prefix(topic, queue_id)
        with self._reading(self._cq) as txn:
            while lo < hi:
                mid = (lo + hi) // 2
                entry = txn.get(codec.cq_key(prefix, mid))
                stamp = None
                if entry is not None:
                    raw = txn.get(codec.OFFSET.pack(codec.CQ_ENTRY.unpack(entry)[0]), db=self._msg)
                    stamp = self._store_ts(raw)
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
        with self._gate.shared():
            self._env.sync(True)
        self._stats["flushes"] += 1

    def _flush_loop(self) -> None:
        interval = self._options.flush_interval_ms / 1000.0
        while not self._clock.wait(self._stop, interval):
            try:
                self.flush()
            except Exception:  # the flusher must outlive one failed sync; the next one retries
                self._log.exception("background lmdb sync failed")

    def clean_expired(self, now_ms: int) -> int:
        """Delete messages stored more than ``file_reserved_hours`` before ``now_ms``.

        Returns how many message records were removed (LMDB has no segment files to count).
        """
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
        idx_keys: list[bytes] = []
        cq_keys: list[bytes] = []
        new_min: dict[bytes, int] = {}
        more = False
        with self._reading(self._msg) as txn:
            for key, raw in txn.cursor():
                if len(doomed) + len(undecodable) >= self._options.retention_batch:
                    more = bool(doomed)
                    break
                try:
                    message = codec.decode_record(raw)
                except CorruptRecordError:
                    # Its age is unknown: it goes only if an expired record follows it.
                    undecodable.append(bytes(key))
                    continue
                if message.store_timestamp_ms >= cutoff:
                    break
                doomed.extend(undecodable)
                undecodable.clear()
                doomed.append(bytes(key))
                idx_keys.extend(codec.index_keys_of(message))
                qkey = codec.queue_prefix(message.topic, message.queue_id)
                cq_keys.append(codec.cq_key(qkey, message.queue_offset))
                new_min[qkey] = max(new_min.get(qkey, 0), message.queue_offset + 1)
        if not doomed:
            return 0, False
        q_puts = []
        for qkey, low in new_min.items():
            state = self._queues[qkey]
            q_puts.append((qkey, codec.QUEUE_STATE.pack(max(state[0], min(low, state[1])), state[1])))

        def apply(wtxn: lmdb.Transaction) -> None:
            for key in doomed:
                wtxn.delete(key, db=self._msg)
            for key in idx_keys:
                wtxn.delete(key, db=self._idx)
            for key in cq_keys:
                wtxn.delete(key, db=self._cq)
            wtxn.cursor(self._qstate).putmulti(q_puts)

        self._write(apply)
        for qkey, packed in q_puts:
            self._queues[qkey][0] = codec.QUEUE_STATE.unpack(packed)[0]
        return len(doomed), more

    def _recover(self) -> None:
        with self._env.begin() as txn:
            state = txn.get(_STATE_KEY, db=self._meta)
            if state is not None:
                self._next_offset, self._last_ts = codec.STORE_STATE.unpack(state)
            for key, value in txn.cursor(self._qstate):
                self._queues[bytes(key)] = list(codec.QUEUE_STATE.unpack(value))
            cursor = txn.cursor(self._msg)
            tail: list[int] = []
            budget = self._options.verify_tail_bytes
            if cursor.last():
                last_offset = codec.OFFSET.unpack(cursor.key())[0]
                self._next_offset = max(self._next_offset, last_offset + len(cursor.value()))
                for key, raw in cursor.iterprev():
                    if len(tail) >= self._options.verify_tail_records or budget <= 0:
                        break
                    tail.append(codec.OFFSET.unpack(key)[0])
                    budget -= len(raw)
            first_bad = None
            for offset in reversed(tail):
                raw = txn.get(codec.OFFSET.pack(offset), db=self._msg)
                try:
                    message = codec.decode_record(raw)
                    if message.commit_log_offset != offset:
                        raise CorruptRecordError("record stored under the wrong offset")
                    self._last_ts = max(self._last_ts, message.store_timestamp_ms)
                except CorruptRecordError as exc:
                    first_bad = offset
                    self._log.error("damaged record in the log tail; cutting the log there",
                                    commit_log_offset=offset, reason=str(exc))
                    break
        if first_bad is not None:
            self._truncate(first_bad)
        self._log.info("store_lmdb opened", next_offset=self._next_offset, queues=len(self._queues))

    def _truncate(self, cut: int) -> None:
        """Remove every record at or after ``cut``, with its consume-queue and index entries."""
        with self._env.begin() as txn:
            doomed: list[bytes] = []
            idx_keys: list[bytes] = []
            cursor = txn.cursor(self._msg)
            if cursor.set_range(codec.OFFSET.pack(cut)):
                for key, raw in cursor:
                    doomed.append(bytes(key))
                    try:
                        idx_keys.extend(codec.index_keys_of(codec.decode_record(raw)))
                    except CorruptRecordError:
                        pass  # its index entries stay behind; queries re-check and skip them
            cq_doomed: list[bytes] = []
            q_puts = []
            for qkey, (low, high) in self._queues.items():
                new_high = high
                while new_high > low:
                    entry = txn.get(codec.cq_key(qkey, new_high - 1), db=self._cq)
                    if entry is None or codec.CQ_ENTRY.unpack(entry)[0] < cut:
                        break
                    new_high -= 1
                    cq_doomed.append(codec.cq_key(qkey, new_high))
                if new_high != high:
                    q_puts.append((qkey, codec.QUEUE_STATE.pack(min(low, new_high), new_high)))

        def apply(wtxn: lmdb.Transaction) -> None:
            for key in doomed:
                wtxn.delete(key, db=self._msg)
            for key in idx_keys:
                wtxn.delete(key, db=self._idx)
            for key in cq_doomed:
                wtxn.delete(key, db=self._cq)
            wtxn.cursor(self._qstate).putmulti(q_puts)

        self._write(apply)
        self._env.sync(True)
        for qkey, packed in q_puts:
            self._queues[qkey] = list(codec.QUEUE_STATE.unpack(packed))
        self._stats["truncated_records"] += len(doomed)
        self._log.warning("log tail cut", cut_offset=cut, records=len(doomed), queue_entries=len(cq_doomed))

    # ------------------------------------------------------------------------------------------

    def stats(self) -> Mapping[str, float]:
        out = dict(self._stats)
        out["group_commits"] = float(self._commit.groups)
        out["map_size"] = float(self._map_size)
        out["next_commit_log_offset"] = float(self._next_offset)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._commit.exclusive():
            self._closed = True
            try:
                self._env.sync(True)
            finally:
                self._env.close()
                os.close(self._lock_fd)
        self._log.info("store_lmdb closed")


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
