"""MessageStore on LMDB: one environment, five named databases, one write transaction per group.

The engine-independent half (queue state, reads, retention, tail cut) is
:class:`plugmq.kit.kvstore.base.KeyValueMessageStore`; this module holds the LMDB half.

Each key family of the layout table in :mod:`plugmq.kit.kvstore.base` (msg, cq, idx, queues,
meta) is one named database of the same name.

The commit-log offset is a byte position (the sum of the sizes of the records before it), like
RocketMQ's physical offset, and is never reused, even after the tail is cut. A message, its
consume-queue entry, its index entries and the queue state go in the same transaction, so a
crash leaves all of them or none (LMDB's copy-on-write B-tree never exposes a half commit).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from plugmq.core import ConsumeQueueEntry, CorruptRecordError, PluginContext, StoreCapabilities, StoreError
from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.kit.diskspace import disk_full_error, free_bytes, is_disk_full
from plugmq.kit.kvstore import codec
from plugmq.kit.kvstore.base import KeyValueMessageStore
from plugmq.kit.kvstore.engine import STATE_KEY, WriteSet
from plugmq.kit.kvstore.gate import ReadGate
from plugmq.plugins.store_lmdb.options import LmdbOptions

log = get_logger(__name__)

_FULL_BELOW = 8 << 20  # an I/O error with less room than this left is taken as a full disk

CAPABILITIES = StoreCapabilities(
    sync_flush=True, async_flush=True, query_by_key=True, query_by_time=True, crash_recovery=True,
    retention=True, concurrent_writers=True, replication=True,
)


class _TxnReader:
    """The families seen through one read transaction."""

    __slots__ = ("_dbs", "txn")

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, object]) -> None:
        self.txn = txn
        self._dbs = dbs

    def get(self, family: str, key: bytes) -> bytes | None:
        return self.txn.get(key, db=self._dbs[family])

    def scan(self, family: str, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        cursor = self.txn.cursor(self._dbs[family])
        if start is not None and not cursor.set_range(start):
            return
        yield from cursor

    def keys_back(self, family: str, bound: bytes) -> Iterator[bytes]:
        cursor = self.txn.cursor(self._dbs[family])
        ok = cursor.key() == bound or cursor.prev() if cursor.set_range(bound) else cursor.last()
        while ok:
            yield cursor.key()
            ok = cursor.prev()

    def last(self, family: str) -> tuple[bytes, bytes] | None:
        cursor = self.txn.cursor(self._dbs[family])
        return cursor.item() if cursor.last() else None


class LmdbStore(KeyValueMessageStore[LmdbOptions]):
    """The store_lmdb MessageStore (see the module docstring for the layout)."""

    NAME = "store_lmdb"
    capabilities = CAPABILITIES
    _FLUSH_FAILED_EVENT = "background lmdb sync failed"
    _ENGINE_STATS = ("map_grows",)

    def __init__(self, context: PluginContext, options: LmdbOptions, *, plugin_name: str = "store_lmdb") -> None:
        root = Path(context.plugin_dir(plugin_name))
        super().__init__(context, options, root=root, data_dir=root, logger=log)

    def _open_engine(self) -> None:
        sync = self._options.flush == "sync"
        try:
            self._env = lmdb.open(
                str(self._dir), map_size=self._options.map_size, max_dbs=5, subdir=True, sync=sync,
                metasync=sync, writemap=self._options.writemap, map_async=False, readahead=False,
                max_readers=self._options.max_readers, lock=True,
            )
        except lmdb.Error as exc:
            raise StoreError(f"cannot open LMDB environment in {self._dir}: {exc}") from exc
        # A map grown in an earlier run stays that size; keep our notion of it in step.
        self._map_size = max(self._options.map_size, self._env.info()["map_size"])
        if self._options.writemap:
            try:
                self._reserve_map(self._map_size)
            except BaseException:
                self._env.close()
                raise
        self._msg = self._env.open_db(b"msg")
        self._cq = self._env.open_db(b"cq")
        self._idx = self._env.open_db(b"idx")
        self._qstate = self._env.open_db(b"queues")
        self._meta = self._env.open_db(b"meta")
        self._dbs = {"msg": self._msg, "cq": self._cq, "idx": self._idx, "queues": self._qstate, "meta": self._meta}
        self._gate = ReadGate()

    def _close_engine(self) -> None:
        self._closed = True
        try:
            self._env.sync(True)
        finally:
            self._env.close()

    # ------------------------------------------------------------------------------------------
    # writes
    # ------------------------------------------------------------------------------------------

    def _write_appends(
        self, msg: list[tuple[bytes, bytes]], cq: list[tuple[bytes, bytes]], idx: list[tuple[bytes, bytes]],
        queues: list[tuple[bytes, bytes]], state: bytes,
    ) -> None:
        def apply(txn: lmdb.Transaction) -> None:
            # Offsets only grow, so MDB_APPEND skips the B-tree search; a refused key is a bug.
            _consumed, added = txn.cursor(self._msg).putmulti(msg, append=True)
            if added != len(msg):
                raise StoreError(f"commit-log offset already used near {msg[0][0].hex()}; store state is inconsistent")
            txn.cursor(self._cq).putmulti(cq)
            if idx:
                txn.cursor(self._idx).putmulti(idx)
            txn.cursor(self._qstate).putmulti(queues)
            txn.put(STATE_KEY, state, db=self._meta)

        self._write(apply)

    def _apply(self, changes: WriteSet) -> None:
        def apply(txn: lmdb.Transaction) -> None:
            for family, start, end in changes.ranges:
                cursor = txn.cursor(self._dbs[family])
                if cursor.set_range(start):
                    # delete() moves to the next key; LMDB keys are never empty, so b"" means "past the end".
                    while (key := cursor.key()) and key < end:
                        cursor.delete()
            for family, key in changes.deletes:
                txn.delete(key, db=self._dbs[family])
            for family, key, value in changes.puts:
                txn.put(key, value, db=self._dbs[family])

        self._write(apply)

    def _write_tail_cut(self, changes: WriteSet) -> None:
        self._apply(changes)
        self._env.sync(True)

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
                if self._disk_full(exc):
                    raise disk_full_error(self._dir, "an LMDB commit") from exc
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
            if self._options.writemap:
                try:
                    self._reserve_map(new_size)
                except StoreFullError:
                    self._env.set_mapsize(self._map_size)
                    raise
        self._log.info("lmdb map grown", old=self._map_size, new=new_size)
        self._map_size = new_size
        self._stats["map_grows"] += 1

    def _reserve_map(self, size: int) -> None:
        """With writemap, LMDB writes through a mapping of a sparse file: a page the full disk has
        no block for would kill the process with SIGBUS. Allocating the map's blocks up front turns
        that into a StoreFullError here."""
        path = self._dir / "data.mdb"
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(self._dir, f"reserving the {size}-byte LMDB map (writemap=true)",
                                      frees="free space on that file system, lower map_size, or set "
                                            "writemap=false (then the map costs no disk until used)") from exc
            raise StoreError(f"cannot reserve the LMDB map of {path}: {exc}") from exc
        finally:
            os.close(fd)

    def _disk_full(self, exc: lmdb.Error) -> bool:
        """LMDB reports a write that found no room as EIO ("Input/output error") or ENOSPC; with
        the file system out of room, that is a full disk, not a broken one."""
        if is_disk_full(exc) or isinstance(exc, lmdb.DiskError):
            return True
        if "Input/output error" not in str(exc):
            return False
        free = free_bytes(self._dir)
        return free is not None and free < _FULL_BELOW

    # ------------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------------

    @contextmanager
    def _txn(self, db: object = None) -> Iterator[lmdb.Transaction]:
        if self._closed:
            raise StoreError("store_lmdb is closed")
        with self._gate.shared(), self._env.begin(db=db) as txn:
            yield txn

    @contextmanager
    def _reading(self) -> Iterator[_TxnReader]:
        with self._txn() as txn:
            yield _TxnReader(txn, self._dbs)

    def _point_get(self, family: str, key: bytes) -> bytes | None:
        with self._txn(self._dbs[family]) as txn:
            return txn.get(key)

    def _read_entries(self, prefix: bytes, start: int, limit: int) -> list[ConsumeQueueEntry]:
        entries: list[ConsumeQueueEntry] = []
        plen = len(prefix)
        with self._txn(self._cq) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(codec.cq_key(prefix, start)):
                return entries
            for key, value in cursor:
                if not key.startswith(prefix) or len(entries) >= limit:
                    break
                clo, size, tags = codec.CQ_ENTRY.unpack(value)
                entries.append(ConsumeQueueEntry(codec.OFFSET.unpack_from(key, plen)[0], clo, size, tags))
        return entries

    # ------------------------------------------------------------------------------------------
    # durability, recovery
    # ------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        with self._gate.shared():
            self._env.sync(True)

    def _verify_tail(self) -> int | None:
        """CRC-check the newest records of the log, oldest first; the first damaged offset, if any."""
        with self._txn(self._msg) as txn:
            cursor = txn.cursor()
            tail: list[int] = []
            budget = self._options.verify_tail_bytes
            if cursor.last():
                for key, raw in cursor.iterprev():
                    if len(tail) >= self._options.verify_tail_records or budget <= 0:
                        break
                    tail.append(codec.OFFSET.unpack(key)[0])
                    budget -= len(raw)
            for offset in reversed(tail):
                try:
                    self._check_tail_record(offset, txn.get(codec.OFFSET.pack(offset)))
                except CorruptRecordError as exc:
                    self._log.error("damaged record in the log tail; cutting the log there",
                                    commit_log_offset=offset, reason=str(exc))
                    return offset
        return None

    def _engine_stats(self) -> dict[str, float]:
        return {"map_size": float(self._map_size)}
