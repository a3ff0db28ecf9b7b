"""MessageStore on RocksDB (rocksdict, raw mode): five column families, one WriteBatch per group.

The engine-independent half (queue state, reads, retention, tail cut) is
:class:`plugmq.core.kvstore.base.KeyValueMessageStore`; this module holds the RocksDB half.

Each key family of the layout table in :mod:`plugmq.core.kvstore.base` (msg, cq, idx, queues,
meta) is one column family of the same name.

The commit-log offset is a byte position (the sum of the sizes of the records before it), like
RocketMQ's physical offset, and is never reused. A message, its consume-queue and index entries
and the queue state go in one atomic WriteBatch; RocksDB's WAL replay (point-in-time mode) keeps
whole batches or drops them, so a crash never leaves a queue entry without its record. Retention
and tail cuts use ``delete_range`` (one tombstone for a run of records) where keys are contiguous.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

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
    ConsumeQueueEntry,
    CorruptRecordError,
    PluginContext,
    StoreCapabilities,
    StoreError,
)
from plugmq.core.kvstore import codec
from plugmq.core.kvstore.base import STATE_KEY, KeyValueMessageStore, WriteSet
from plugmq.core.logs import get_logger
from plugmq.plugins.store_rocks.options import RocksOptions

log = get_logger(__name__)

CAPABILITIES = StoreCapabilities(
    sync_flush=True, async_flush=True, query_by_key=True, query_by_time=True, crash_recovery=True,
    retention=True, concurrent_writers=True,
)
_FAMILIES = ("msg", "cq", "idx", "queues", "meta")


def _db_options(options: RocksOptions) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    opts.set_write_buffer_size(options.write_buffer_size)
    opts.set_compression_type(getattr(DBCompressionType, options.compression)())
    opts.set_keep_log_file_num(4)
    return opts


class _LiveReader:
    """The column families read directly (RocksDB reads need no transaction here)."""

    __slots__ = ("_store",)

    def __init__(self, store: RocksStore) -> None:
        self._store = store

    def get(self, family: str, key: bytes) -> bytes | None:
        return self._store._point_get(family, key)

    def scan(self, family: str, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self._store._cf[family].iter(ReadOptions())
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        try:
            while it.valid():
                yield it.key(), it.value()
                it.next()
        finally:
            del it

    def keys_back(self, family: str, bound: bytes) -> Iterator[bytes]:
        it = self._store._cf[family].iter(ReadOptions())
        it.seek_for_prev(bound)
        try:
            while it.valid():
                yield it.key()
                it.prev()
        finally:
            del it

    def last(self, family: str) -> tuple[bytes, bytes] | None:
        it = self._store._cf[family].iter(ReadOptions())
        it.seek_to_last()
        item = (it.key(), it.value()) if it.valid() else None
        del it
        return item


class RocksStore(KeyValueMessageStore[RocksOptions]):
    """The store_rocks MessageStore (see the module docstring for the layout)."""

    NAME = "store_rocks"
    capabilities = CAPABILITIES
    _FLUSH_FAILED_EVENT = "background rocksdb flush failed"

    def __init__(self, context: PluginContext, options: RocksOptions, *, plugin_name: str = "store_rocks") -> None:
        root = Path(context.plugin_dir(plugin_name))
        super().__init__(context, options, root=root, data_dir=root / "db", logger=log)

    def _open_engine(self) -> None:
        db_opts = _db_options(self._options)
        try:
            self._db = Rdict(str(self._dir), db_opts,
                             column_families={name: _db_options(self._options) for name in _FAMILIES})
        except Exception as exc:  # rocksdict raises plain Exception for engine errors
            raise StoreError(f"cannot open RocksDB in {self._dir}: {exc}") from exc
        self._cf = {name: self._db.get_column_family(name) for name in _FAMILIES}
        self._handle = {name: self._db.get_column_family_handle(name) for name in _FAMILIES}
        self._write_opts = WriteOptions()
        self._write_opts.sync = self._options.flush == "sync"
        self._write_opts.disable_wal = self._options.disable_wal
        self._reader = _LiveReader(self)

    def _close_engine(self) -> None:
        try:
            self.flush()
        finally:
            self._closed = True
            # Column-family objects keep RocksDB alive; drop them before the DB itself.
            self._cf.clear()
            self._handle.clear()
            self._db.close()  # rocksdict flushes the memtables to SST files on the way out
            del self._db

    # ------------------------------------------------------------------------------------------
    # writes
    # ------------------------------------------------------------------------------------------

    def _write_appends(
        self, msg: list[tuple[bytes, bytes]], cq: list[tuple[bytes, bytes]], idx: list[tuple[bytes, bytes]],
        queues: list[tuple[bytes, bytes]], state: bytes,
    ) -> None:
        wb = WriteBatch(raw_mode=True)
        put, handle = wb.put, self._handle
        msg_cf, cq_cf, idx_cf, q_cf = handle["msg"], handle["cq"], handle["idx"], handle["queues"]
        for key, value in msg:
            put(key, value, msg_cf)
        for key, value in cq:
            put(key, value, cq_cf)
        for key, value in idx:
            put(key, value, idx_cf)
        for key, value in queues:
            put(key, value, q_cf)
        put(STATE_KEY, state, handle["meta"])
        self._write(wb)

    def _batch(self, changes: WriteSet) -> WriteBatch:
        wb = WriteBatch(raw_mode=True)
        for family, start, end in changes.ranges:
            wb.delete_range(start, end, self._handle[family])
        for family, key in changes.deletes:
            wb.delete(key, self._handle[family])
        for family, key, value in changes.puts:
            wb.put(key, value, self._handle[family])
        return wb

    def _apply(self, changes: WriteSet) -> None:
        self._write(self._batch(changes))

    def _write_tail_cut(self, changes: WriteSet) -> None:
        write_opts = WriteOptions()
        write_opts.sync = True
        try:
            self._db.write(self._batch(changes), write_opts)
        except Exception as exc:
            raise StoreError(f"cutting the damaged log tail in {self._dir} failed: {exc}") from exc

    def _write(self, wb: WriteBatch) -> None:
        try:
            self._db.write(wb, self._write_opts)
        except Exception as exc:  # rocksdict raises plain Exception for engine errors
            raise StoreError(f"RocksDB write failed in {self._dir}: {exc}") from exc

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    def _reading(self) -> nullcontext[_LiveReader]:
        return nullcontext(self._reader)

    def _point_get(self, family: str, key: bytes) -> bytes | None:
        try:
            return self._cf[family].get(key)
        except Exception as exc:  # noqa: BLE001 - a damaged block surfaces as an engine error: no record, logged
            self._stats["corrupt_records"] += 1
            self._log.error("rocksdb read failed", family=family, key=key.hex(), reason=str(exc))
            return None

    def _read_entries(self, prefix: bytes, start: int, limit: int) -> list[ConsumeQueueEntry]:
        plen = len(prefix)
        read_opts = ReadOptions()
        read_opts.set_iterate_upper_bound(prefix + b"\xff" * 8 + b"\x00")
        it = self._cf["cq"].iter(read_opts)
        it.seek(codec.cq_key(prefix, start))
        entries: list[ConsumeQueueEntry] = []
        while it.valid() and len(entries) < limit:
            key = it.key()
            if not key.startswith(prefix):
                break
            clo, size, tags = codec.CQ_ENTRY.unpack(it.value())
            entries.append(ConsumeQueueEntry(codec.OFFSET.unpack_from(key, plen)[0], clo, size, tags))
            it.next()
        del it
        return entries

    # ------------------------------------------------------------------------------------------
    # durability, recovery
    # ------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        try:
            if self._options.disable_wal:
                for family in self._cf.values():
                    family.flush(True)
            else:
                self._db.flush_wal(True)
        except Exception as exc:
            raise StoreError(f"RocksDB flush failed in {self._dir}: {exc}") from exc

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
                entry = self._point_get("cq", codec.cq_key(qkey, queue_offset))
                if entry is None:
                    break
                offset = codec.CQ_ENTRY.unpack(entry)[0]
                if offset < window:
                    break
                checked += 1
                queue_offset -= 1
                try:
                    self._check_tail_record(offset, self._point_get("msg", codec.OFFSET.pack(offset)))
                except CorruptRecordError as exc:
                    self._log.error("damaged record in the log tail", commit_log_offset=offset, reason=str(exc))
                    first_bad = offset if first_bad is None else min(first_bad, offset)
        return first_bad
