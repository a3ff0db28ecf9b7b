"""The engine-independent half of a MessageStore on a sorted key-value engine.

:class:`KeyValueMessageStore` holds what store_lmdb and store_rocks do alike: queue state kept
in memory, offset assignment and group commit, reads by offset/queue/key/time, retention, the
tail cut after a crash, flushing, stats and open/close bookkeeping. A subclass supplies the
engine: opening and closing it, one atomic write of a group of appends or of a :class:`WriteSet`,
a point get, a read view (:class:`~plugmq.kit.kvstore.engine.KVReader`) and a fast consume-queue scan.

Both engines hold the same five key families (the names are the families' names below):

=========  ==========================================  ==========================================
family     key                                         value
=========  ==========================================  ==========================================
msg        commit-log offset (8 B big-endian)          the record (codec.py), CRC-protected
cq         topic | queue id | queue offset (BE)        20-byte entry offset:int64|size:int32|tag:int64
idx        topic | key | store ts | offset             empty (the key is the entry)
queues     topic | queue id                            min offset, max offset
meta       b"state"                                    next commit-log offset, last store timestamp
=========  ==========================================  ==========================================
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

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
    encode_msg_id,
    validate_topic,
)
from plugmq.core.message import decode_msg_id
from plugmq.kit.kvstore import codec
from plugmq.kit.kvstore.engine import STATE_KEY, KVStoreOptions, WriteSet, lock_directory
from plugmq.kit.kvstore.groupcommit import GroupCommit
from plugmq.kit.kvstore.replica import KeyValueReplicaLog

MAX_U64 = (1 << 64) - 1
PAST_ALL_OFFSETS = b"\xff" * 9  # sorts after every 8-byte offset key
_MAX_QUEUE_ID = 0xFFFF_FFFF


O = TypeVar("O", bound=KVStoreOptions)  # noqa: E741 - reads as "Options" in the generics below


class KeyValueMessageStore(KeyValueReplicaLog, ABC, Generic[O]):
    """A MessageStore whose engine keeps the families above in sorted key order.

    Log shipping to and from other key-value stores: :class:`KeyValueReplicaLog`.
    """

    NAME: ClassVar[str]  # the plugin's name, used in messages, log events and the flusher's name
    capabilities: ClassVar[StoreCapabilities]
    _FLUSH_FAILED_EVENT: ClassVar[str]
    _ENGINE_STATS: ClassVar[tuple[str, ...]] = ()  # engine-specific counters, zero at open

    def __init__(self, context: PluginContext, options: O, *, root: Path, data_dir: Path, logger: Any) -> None:
        self._options = options
        self._clock = context.clock
        self._store_host = context.store_host
        self._id_prefix = encode_msg_id(context.store_host, 0)[:16]
        self._max_body = context.store_body_limit
        self._dir = data_dir
        self._log = logger.bind(store=str(data_dir), flush=options.flush)
        self._lock_fd = lock_directory(root)
        self._closed = False
        try:
            self._open_engine()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._commit = GroupCommit(self._commit_groups)
        self._queues: dict[bytes, list[int]] = {}
        self._next_offset = 0
        self._last_ts = 0
        self._stats = {"messages": 0.0, "bytes": 0.0, **dict.fromkeys(self._ENGINE_STATS, 0.0),
                       "corrupt_records": 0.0, "flushes": 0.0, "truncated_records": 0.0, "expired_records": 0.0,
                       "retention_held": 0.0}
        self._floor = context.retention  # never clean at or above what consumers still need
        self._oldest_ts: int | None = None  # store time of the oldest record, once looked up
        self._recover()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if options.flush == "async":
            self._flusher = threading.Thread(target=self._flush_loop, name=f"{self.NAME}-flush", daemon=True)
            self._flusher.start()

    # ------------------------------------------------------------------------------------------
    # engine primitives
    # ------------------------------------------------------------------------------------------

    @abstractmethod
    def _open_engine(self) -> None:
        """Open the engine in ``self._dir``; raise StoreError saying why it cannot be opened."""

    @abstractmethod
    def _close_engine(self) -> None:
        """Sync and close the engine; set ``self._closed`` at the point readers must stop."""

    # _write_appends, _write_tail_cut and _reading are engine methods too: KeyValueReplicaLog,
    # which needs them as well, declares them.

    @abstractmethod
    def _apply(self, changes: WriteSet) -> None:
        """Write ``changes`` atomically, with the flush mode's durability."""

    @abstractmethod
    def _point_get(self, family: str, key: bytes) -> bytes | None: ...

    @abstractmethod
    def _read_entries(self, prefix: bytes, start: int, limit: int) -> list[ConsumeQueueEntry]:
        """Up to ``limit`` consume-queue entries of the queue ``prefix`` from queue offset ``start``."""

    @abstractmethod
    def _verify_tail(self) -> int | None:
        """CRC-check the log's tail (see :meth:`_check_tail_record`); the offset to cut at, if any."""

    @abstractmethod
    def _sync(self) -> None:
        """Make every committed write durable."""

    def _engine_stats(self) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------------------------------------
    # appends
    # ------------------------------------------------------------------------------------------

    def append(self, request: AppendRequest) -> AppendResult:
        return self.append_batch([request])[0]

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        if self._closed:
            raise StoreError(f"{self.NAME} is closed; open a new store to append")
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
        self._write_appends(msg_puts, cq_puts, idx_puts, q_puts, codec.STORE_STATE.pack(offset, store_ts))
        self._next_offset = offset
        self._log_end = offset
        self._last_ts = store_ts
        if self._log_listener is not None:
            self._log_listener(offset)
        for k, v in next_q.items():
            state = self._queues.get(k)
            if state is None:
                self._queues[k] = [0, v]
            else:
                state[1] = v
        self._stats["messages"] += len(msg_puts)
        self._stats["bytes"] += written
        return outcome

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.NAME} is closed")

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
        if not 0 <= commit_log_offset <= MAX_U64:
            return None
        raw = self._point_get("msg", codec.OFFSET.pack(commit_log_offset))
        return None if raw is None else self._decode(raw, commit_log_offset)

    def read_many(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        """BulkReading: the records of a run read through one read view (one LMDB transaction, one
        hold of RocksDB's gate) instead of one per record, each decoded and checked as ``read``."""
        self._check_open()
        offsets = [entry.commit_log_offset for entry in entries]
        keys = [codec.OFFSET.pack(offset) for offset in offsets if 0 <= offset <= MAX_U64]
        with self._reading() as reader:
            found = iter(self._get_many(reader, "msg", keys))
        out: list[StoredMessage | None] = []
        for offset in offsets:
            raw = next(found) if 0 <= offset <= MAX_U64 else None
            out.append(None if raw is None else self._decode(raw, offset))
        return out

    def _get_many(self, reader: Any, family: str, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in one read view (an engine with a multi-get overrides this)."""
        get = reader.get
        return [get(family, key) for key in keys]

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        self._check_open()
        if max_entries <= 0 or not 0 <= queue_id <= _MAX_QUEUE_ID:
            return []
        prefix = codec.queue_prefix(topic, queue_id)
        # Entries become readable when the engine commits, the in-memory max a moment later:
        # never show an entry max_offset does not count yet, or a reader's next offset is "illegal".
        state = self._queues.get(prefix)
        published = state[1] if state else 0
        max_entries = min(max_entries, published - max(offset, 0))
        if max_entries <= 0:
            return []
        return self._read_entries(prefix, max(offset, 0), max_entries)

    def min_offset(self, topic: str, queue_id: int) -> int:
        state = self._queues.get(codec.queue_prefix(topic, queue_id)) if 0 <= queue_id <= _MAX_QUEUE_ID else None
        return state[0] if state else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        state = self._queues.get(codec.queue_prefix(topic, queue_id)) if 0 <= queue_id <= _MAX_QUEUE_ID else None
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
        end = MAX_U64 if end_ms is None else min(end_ms, MAX_U64)
        if end < max(begin_ms, 0):
            return []
        found: list[StoredMessage] = []
        seen: set[int] = set()
        with self._reading() as reader:
            for k in reader.keys_back("idx", codec.index_key(prefix, end, MAX_U64)):
                if len(found) >= max_results or not k.startswith(prefix) or len(k) != plen + 16:
                    break
                store_ts, offset = codec.split_index_key(k, plen)
                if store_ts < begin_ms:
                    break
                if offset in seen:
                    continue
                seen.add(offset)
                raw = reader.get("msg", codec.OFFSET.pack(offset))
                message = None if raw is None else self._decode(raw, offset)
                # Stale entries (record cut or expired) simply do not match any more.
                if (message is not None and message.topic == topic and message.store_timestamp_ms == store_ts
                        and codec.has_key(message, key)):
                    found.append(message)
        return found

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Binary search over the queue: store times never decrease along a queue."""
        self._check_open()
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        prefix = codec.queue_prefix(topic, queue_id)
        with self._reading() as reader:
            while lo < hi:
                mid = (lo + hi) // 2
                entry = reader.get("cq", codec.cq_key(prefix, mid))
                stamp = None
                if entry is not None:
                    stamp = self._store_ts(reader.get("msg", codec.OFFSET.pack(codec.CQ_ENTRY.unpack(entry)[0])))
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
        self._sync()
        self._stats["flushes"] += 1

    def _flush_loop(self) -> None:
        interval = self._options.flush_interval_ms / 1000.0
        while not self._clock.wait(self._stop, interval):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the flusher must outlive one failed sync; the next one retries
                self._log.exception(self._FLUSH_FAILED_EVENT)

    def clean_expired(self, now_ms: int) -> int:
        """Delete messages stored more than ``file_reserved_hours`` before ``now_ms`` - never one
        at or above the retention floor (``context.retention``: what a consumer group or a
        service has not consumed yet).

        Returns how many message records were removed (a key-value engine has no segment files).
        A key-value store has no force-clean watermark: deleting records does not shrink an LMDB
        file (freed pages are reused) and RocksDB frees space only at compaction, so a disk-use
        trigger would delete far more than needed; a full disk refuses writes instead.
        """
        self._check_open()
        cutoff = now_ms - int(self._options.file_reserved_hours * 3_600_000)
        if self._oldest_ts is None:
            self._oldest_ts = self._first_store_ts()
        if self._oldest_ts is None or self._oldest_ts >= cutoff:
            return 0  # nothing has expired: the common case, answered without touching the engine
        floor = self._floor.lowest() if self._floor is not None else None
        removed = 0
        held = False
        while True:
            with self._commit.exclusive():
                count, more, held = self._clean_chunk(cutoff, floor)
            removed += count
            if not more:
                break
        if removed:
            self._stats["expired_records"] += removed
            self._log.info("expired messages removed", count=removed, cutoff_ms=cutoff)
        self._oldest_ts = None if removed else self._oldest_ts
        if held and not self._stats["retention_held"]:
            self._log.info("expired messages kept: a consumer group or service has not consumed them",
                           floor=floor, holders=self._floor.holders() if self._floor is not None else {})
        self._stats["retention_held"] = float(held)
        return removed

    def _first_store_ts(self) -> int | None:
        """Store time of the oldest record (None for an empty log); an unreadable one counts as
        expired, so that a round looks closer."""
        with self._reading() as reader:
            for _key, raw in reader.scan("msg"):
                return self._store_ts(raw) or 0
        return None

    def _clean_chunk(self, cutoff: int, floor: int | None = None) -> tuple[int, bool, bool]:
        doomed: list[bytes] = []
        undecodable: list[bytes] = []
        changes = WriteSet()
        new_min: dict[bytes, int] = {}
        more = held = False
        with self._reading() as reader:
            for key, raw in reader.scan("msg"):
                if len(doomed) + len(undecodable) >= self._options.retention_batch:
                    more = bool(doomed)
                    break
                try:
                    message = codec.decode_record(raw)
                except CorruptRecordError:
                    # Its age is unknown: it goes only if an expired record follows it.
                    undecodable.append(key)
                    continue
                if message.store_timestamp_ms >= cutoff:
                    break
                if floor is not None and message.commit_log_offset >= floor:
                    held = True
                    break
                doomed.extend(undecodable)
                undecodable.clear()
                doomed.append(key)
                for index_key in codec.index_keys_of(message):
                    changes.delete("idx", index_key)
                qkey = codec.queue_prefix(message.topic, message.queue_id)
                new_min[qkey] = max(new_min.get(qkey, 0), message.queue_offset + 1)
        if not doomed:
            return 0, False, held
        # The doomed records are the first ones of the log, contiguous: one range.
        changes.delete_range("msg", doomed[0], codec.OFFSET.pack(codec.OFFSET.unpack(doomed[-1])[0] + 1))
        q_new: dict[bytes, int] = {}
        for qkey, low in new_min.items():
            state = self._queues[qkey]
            new_low = max(state[0], min(low, state[1]))
            changes.delete_range("cq", codec.cq_key(qkey, 0), codec.cq_key(qkey, new_low))
            changes.put("queues", qkey, codec.QUEUE_STATE.pack(new_low, state[1]))
            q_new[qkey] = new_low
        self._apply(changes)
        for qkey, low in q_new.items():
            self._queues[qkey][0] = low
        return len(doomed), more, held

    def _recover(self) -> None:
        with self._reading() as reader:
            state = reader.get("meta", STATE_KEY)
            if state is not None:
                self._next_offset, self._last_ts = codec.STORE_STATE.unpack(state)
            for key, value in reader.scan("queues"):
                self._queues[bytes(key)] = list(codec.QUEUE_STATE.unpack(value))
            last = reader.last("msg")
            if last is not None:
                self._next_offset = max(self._next_offset, codec.OFFSET.unpack(last[0])[0] + len(last[1]))
        first_bad = self._verify_tail()
        if first_bad is not None:
            self._truncate(first_bad)
        self._log.info(f"{self.NAME} opened", next_offset=self._next_offset, queues=len(self._queues))

    def _check_tail_record(self, offset: int, raw: bytes | None) -> None:
        """Raise CorruptRecordError unless ``raw`` is the sound record of ``offset``."""
        if raw is None:
            raise CorruptRecordError("record missing or unreadable")
        message = codec.decode_record(raw)
        if message.commit_log_offset != offset:
            raise CorruptRecordError("record stored under the wrong offset")
        self._last_ts = max(self._last_ts, message.store_timestamp_ms)

    def _truncate(self, cut: int) -> None:
        """Remove every record at or after ``cut``, with its consume-queue and index entries."""
        changes = WriteSet()
        count = cq_removed = 0
        q_new: dict[bytes, list[int]] = {}
        with self._reading() as reader:
            for _key, raw in reader.scan("msg", codec.OFFSET.pack(cut)):
                count += 1
                try:
                    for index_key in codec.index_keys_of(codec.decode_record(raw)):
                        changes.delete("idx", index_key)
                except CorruptRecordError:
                    pass  # its index entries stay behind; queries re-check and skip them
            for qkey, (low, high) in self._queues.items():
                new_high = high
                while new_high > low:
                    entry = reader.get("cq", codec.cq_key(qkey, new_high - 1))
                    if entry is None or codec.CQ_ENTRY.unpack(entry)[0] < cut:
                        break
                    new_high -= 1
                if new_high != high:
                    changes.delete_range("cq", codec.cq_key(qkey, new_high), codec.cq_key(qkey, high))
                    q_new[qkey] = [min(low, new_high), new_high]
                    changes.put("queues", qkey, codec.QUEUE_STATE.pack(*q_new[qkey]))
                    cq_removed += high - new_high
        changes.delete_range("msg", codec.OFFSET.pack(cut), PAST_ALL_OFFSETS)
        self._write_tail_cut(changes)
        self._queues.update(q_new)
        self._stats["truncated_records"] += count
        self._log.warning("log tail cut", cut_offset=cut, records=count, queue_entries=cq_removed, queues=len(q_new))

    # ------------------------------------------------------------------------------------------

    def stats(self) -> Mapping[str, float]:
        out = dict(self._stats)
        out["group_commits"] = float(self._commit.groups)
        out.update(self._engine_stats())
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
                self._close_engine()
            finally:
                self._closed = True
                os.close(self._lock_fd)
        self._log.info(f"{self.NAME} closed")
