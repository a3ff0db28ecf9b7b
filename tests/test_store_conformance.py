"""The storage conformance suite against store_lmdb, store_rocks and store_mmap, sync and async.

Each store's ``corrupt_tail`` hook damages real bytes in its real files: the suite must then
never get the damaged record back.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from plugmq.conformance.storage import (
    StoreConformance,
    StoreUnderTest,
    flip_newest_body,
)


def _flip_everywhere(path: Path, needle: bytes, where: int) -> int:
    """Flip one byte at ``where`` inside every copy of ``needle`` in the file; how many copies."""
    data = bytearray(path.read_bytes())
    hits = 0
    pos = data.find(needle)
    while pos >= 0:
        data[pos + where] ^= 0x5A
        hits += 1
        pos = data.find(needle, pos + 1)
    path.write_bytes(bytes(data))
    return hits


def corrupt_lmdb_tail(data_dir: Path) -> None:
    """Flip a body byte of the newest record inside data.mdb (LMDB itself checksums nothing)."""
    env_dir = data_dir / "store_lmdb"
    env = lmdb.open(str(env_dir), readonly=True, lock=False, max_dbs=5, subdir=True)
    try:
        msg = env.open_db(b"msg", create=False)
        with env.begin(db=msg) as txn:
            cursor = txn.cursor()
            assert cursor.last(), "no record to damage"
            raw = bytes(cursor.value())
    finally:
        env.close()
    assert _flip_everywhere(env_dir / "data.mdb", raw, len(raw) - 3) >= 1


def corrupt_rocks_tail(data_dir: Path) -> None:
    """Flip a byte of the newest record inside its SST file: RocksDB's block checksum fails."""
    db_dir = data_dir / "store_rocks" / "db"
    from rocksdict import Options, Rdict

    db = Rdict(str(db_dir), Options(raw_mode=True), column_families={
        name: Options(raw_mode=True) for name in ("msg", "cq", "idx", "queues", "meta")})
    try:
        msg = db.get_column_family("msg")
        it = msg.iter()
        it.seek_to_last()
        raw = bytes(it.value())
        del it, msg
    finally:
        db.close()
    hits = sum(_flip_everywhere(sst, raw[-64:], 10) for sst in db_dir.glob("*.sst"))
    assert hits >= 1, "the newest record is in no SST file"


# Small files, but segments still hold one 4 MiB body (the max-size clause).
_MMAP_SMALL = {"commit_log_segment_size": 8 << 20, "consume_queue_entries_per_file": 1000,
               "index_slot_count": 1024, "index_max_entries": 4096}


class TestLmdbSync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        return StoreUnderTest("store_lmdb", {"flush": "sync", "map_size": 1 << 20}, corrupt_tail=corrupt_lmdb_tail)


class TestLmdbAsync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        return StoreUnderTest("store_lmdb", {"flush": "async", "flush_interval_ms": 50}, corrupt_tail=corrupt_lmdb_tail)


class TestRocksSync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        return StoreUnderTest("store_rocks", {"flush": "sync", "write_buffer_size": 1 << 20},
                              corrupt_tail=corrupt_rocks_tail)


class TestRocksAsync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        return StoreUnderTest("store_rocks", {"flush": "async", "flush_interval_ms": 50},
                              corrupt_tail=corrupt_rocks_tail)


class TestMmapSync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        options = {"flush": "sync", "append_kernel": "c", **_MMAP_SMALL}
        return StoreUnderTest("store_mmap", options, corrupt_tail=flip_newest_body("store_mmap", options))


class TestMmapAsync(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        options = {"flush": "async", "append_kernel": "c", **_MMAP_SMALL}
        return StoreUnderTest("store_mmap", options, corrupt_tail=flip_newest_body("store_mmap", options))


# The same suite against store_mmap's pure-Python append and scan kernels (the compiled ones, the
# default, are above): both must keep every clause (test_store_mmap_appender.py: and write the same
# bytes; the scan kernel also serves the bulk reads).
class TestMmapSyncPythonKernel(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        options = {"flush": "sync", "append_kernel": "python", "scan_kernel": "python", **_MMAP_SMALL}
        return StoreUnderTest("store_mmap", options, corrupt_tail=flip_newest_body("store_mmap", options))


class TestMmapAsyncPythonKernel(StoreConformance):
    @pytest.fixture
    def store_plugin(self) -> StoreUnderTest:
        options = {"flush": "async", "append_kernel": "python", "scan_kernel": "python", **_MMAP_SMALL}
        return StoreUnderTest("store_mmap", options, corrupt_tail=flip_newest_body("store_mmap", options))
