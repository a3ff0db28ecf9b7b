"""MessageStore on RocksDB (rocksdict, raw mode): five column families, one WriteBatch per group.

The engine-independent half (queue state, reads, retention, tail cut) is
:class:`plugmq.kit.kvstore.base.KeyValueMessageStore`; this module holds the RocksDB half.

Each key family of the layout table in :mod:`plugmq.kit.kvstore.base` (msg, cq, idx, queues,
meta) is one column family of the same name.

The commit-log offset is a byte position (the sum of the sizes of the records before it), like
RocketMQ's physical offset, and is never reused. A message, its consume-queue and index entries
and the queue state go in one atomic WriteBatch; RocksDB's WAL replay (point-in-time mode) keeps
whole batches or drops them, so a crash never leaves a queue entry without its record. Retention
and tail cuts use ``delete_range`` (one tombstone for a run of records) where keys are contiguous.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    AccessType,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from plugmq.core import ConsumeQueueEntry, CorruptRecordError, PluginContext, StoreCapabilities, StoreError
from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.kit.diskspace import disk_full_error, free_bytes, is_disk_full
from plugmq.kit.kvstore import codec
from plugmq.kit.kvstore.base import KeyValueMessageStore
from plugmq.kit.kvstore.engine import STATE_KEY, WriteSet
from plugmq.kit.kvstore.gate import ReadGate
from plugmq.plugins.store_rocks.options import RocksOptions

log = get_logger(__name__)

CAPABILITIES = StoreCapabilities(
    sync_flush=True, async_flush=True, query_by_key=True, query_by_time=True, crash_recovery=True,
    retention=True, concurrent_writers=True, replication=True,
)
_FAMILIES = ("msg", "cq", "idx", "queues", "meta")
_REOPEN_MARGIN = 256 << 10  # room beyond the WAL's size a reopen needs (manifest, options, info log)


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
        return self._store._raw_get(family, key)

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
        self._gate = ReadGate()
        self._read_only = False  # opened read-only: the disk had no room to replay the WAL
        self._broken = False  # a write hit a full disk; RocksDB refuses writes until reopened
        self._deferred_cut: int | None = None
        self._write_opts = WriteOptions()
        self._write_opts.sync = self._options.flush == "sync"
        # rocksdict's stub declares disable_wal a method; at run time it is a settable property.
        self._write_opts.disable_wal = self._options.disable_wal  # type: ignore[method-assign, assignment]
        self._reader = _LiveReader(self)
        try:
            self._connect(read_only=False)
        except StoreFullError as exc:
            # Opening replays the WAL into new table files; with no room for them, open read-only
            # (every acknowledged write is readable) and reopen for writing once there is room.
            self._log.warning("disk full at open: store_rocks is read-only until space is freed", error=str(exc))
            try:
                self._connect(read_only=True)
            except StoreError:
                raise exc from None
            self._read_only = True

    def _connect(self, *, read_only: bool) -> None:
        db_opts = _db_options(self._options)
        try:
            self._db = Rdict(str(self._dir), db_opts,
                             column_families={name: _db_options(self._options) for name in _FAMILIES},
                             access_type=AccessType.read_only() if read_only else AccessType.read_write())
        except Exception as exc:  # rocksdict raises plain Exception for engine errors
            if is_disk_full(exc):
                raise disk_full_error(self._dir, "opening RocksDB (WAL replay writes table files)") from exc
            raise StoreError(f"cannot open RocksDB in {self._dir}: {exc}") from exc
        self._cf = {name: self._db.get_column_family(name) for name in _FAMILIES}
        self._handle = {name: self._db.get_column_family_handle(name) for name in _FAMILIES}

    def _disconnect(self) -> None:
        """Close the engine, whatever state it is in: a close after a disk-full error reports the
        error RocksDB kept, but still releases the database (its WAL holds every acknowledged write)."""
        # Column-family objects keep RocksDB alive; drop them before the DB itself.
        self._cf.clear()
        self._handle.clear()
        try:
            self._db.close()  # rocksdict flushes the memtables to SST files on the way out
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception; logged, the WAL keeps the data
            self._log.warning("rocksdb reported an error while closing; unflushed memtables are replayed from the "
                              "WAL at the next open", error=str(exc))
        del self._db
        gc.collect()  # rocksdict releases the DB (and its LOCK) only when the last reference is collected

    def _close_engine(self) -> None:
        try:
            if not (self._broken or self._read_only):
                self.flush()
        except StoreError as exc:
            self._log.warning("final rocksdb flush failed", error=str(exc))
        finally:
            self._closed = True
            with self._gate.exclusive():
                self._disconnect()

    def _ensure_writable(self) -> None:
        """After a disk-full error (or a read-only open) RocksDB must be reopened to write again:
        done here once the file system has room, else StoreFullError at once."""
        if not (self._broken or self._read_only):
            return
        need = _REOPEN_MARGIN + sum(f.stat().st_size for f in self._dir.glob("*.log"))
        free = free_bytes(self._dir)
        if free is not None and free < need:
            raise disk_full_error(self._dir, f"reopening RocksDB for writing ({need} bytes needed to replay its WAL)")
        with self._gate.exclusive():
            self._disconnect()
            try:
                self._connect(read_only=False)
            except StoreError:
                try:
                    self._connect(read_only=True)
                except StoreError:
                    self._closed = True  # not even readable: a new store must be opened
                    self._log.error("store_rocks could not be reopened; open it again when the disk has room")
                    raise
                self._read_only = True
                raise
            self._read_only = self._broken = False
        self._log.info("store_rocks writable again after a full disk")
        if self._deferred_cut is not None:
            cut, self._deferred_cut = self._deferred_cut, None
            self._truncate(cut)

    # ------------------------------------------------------------------------------------------
    # writes
    # ------------------------------------------------------------------------------------------

    def _write_appends(
        self, msg: list[tuple[bytes, bytes]], cq: list[tuple[bytes, bytes]], idx: list[tuple[bytes, bytes]],
        queues: list[tuple[bytes, bytes]], state: bytes,
    ) -> None:
        self._ensure_writable()  # before any column-family handle is held: a reopen needs them all released
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
        # A failed write's traceback keeps this frame: it must not keep the DB alive through handles.
        del put, handle, msg_cf, cq_cf, idx_cf, q_cf
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
        self._ensure_writable()
        self._write(self._batch(changes))

    def _write_tail_cut(self, changes: WriteSet) -> None:
        write_opts = WriteOptions()
        write_opts.sync = True
        try:
            self._db.write(self._batch(changes), write_opts)
        except Exception as exc:
            if is_disk_full(exc):
                self._broken = True
                raise disk_full_error(self._dir, "cutting the damaged log tail") from exc
            raise StoreError(f"cutting the damaged log tail in {self._dir} failed: {exc}") from exc

    def _truncate(self, cut: int) -> None:
        if self._read_only:  # cut once writable; reads never return the damaged records meanwhile
            self._log.warning("damaged log tail found while read-only; it is cut when space allows writes",
                              cut_offset=cut)
            self._deferred_cut = cut
            self._next_offset = max(self._next_offset, cut)
            return
        super()._truncate(cut)

    def _write(self, wb: WriteBatch) -> None:
        try:
            self._db.write(wb, self._write_opts)
        except Exception as exc:
            if is_disk_full(exc):
                self._broken = True  # RocksDB keeps refusing writes until it is reopened
                raise disk_full_error(self._dir, "a RocksDB write") from exc
            raise StoreError(f"RocksDB write failed in {self._dir}: {exc}") from exc

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[_LiveReader]:
        with self._gate.shared():
            if self._closed:
                raise StoreError("store_rocks is closed")
            yield self._reader

    def _point_get(self, family: str, key: bytes) -> bytes | None:
        with self._gate.shared():
            if self._closed:
                raise StoreError("store_rocks is closed")
            return self._raw_get(family, key)

    def _get_many(self, reader: Any, family: str, keys: list[bytes]) -> list[bytes | None]:
        """RocksDB's MultiGet; a damaged block fails the call: then key by key (logged, None)."""
        try:
            found = self._cf[family].get(list[Any](keys))
        except Exception:  # noqa: BLE001 - _raw_get says which key and counts it
            return [self._raw_get(family, key) for key in keys]
        return cast(list[bytes | None], found)

    def _raw_get(self, family: str, key: bytes) -> bytes | None:
        """A read inside the gate (``_reading`` or ``_point_get`` holds it)."""
        try:
            return self._cf[family].get(key)
        except Exception as exc:  # noqa: BLE001 - a damaged block surfaces as an engine error: no record, logged
            self._stats["corrupt_records"] += 1
            self._log.error("rocksdb read failed", family=family, key=key.hex(), reason=str(exc))
            return None

    def _read_entries(self, prefix: bytes, start: int, limit: int) -> list[ConsumeQueueEntry]:
        with self._gate.shared():
            if self._closed:
                raise StoreError("store_rocks is closed")
            return self._scan_entries(prefix, start, limit)

    def _scan_entries(self, prefix: bytes, start: int, limit: int) -> list[ConsumeQueueEntry]:
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
        if self._broken or self._read_only:
            return  # writes are refused meanwhile: nothing new to make durable
        with self._gate.shared():
            if not self._closed:
                self._sync_engine()

    def _sync_engine(self) -> None:
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
