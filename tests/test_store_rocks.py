"""store_rocks beyond the shared suite and test_store_kv.py: WAL-less mode, a damaged SST block."""

from __future__ import annotations

from pathlib import Path

from plugmq.broker.components import open_store
from plugmq.core import AppendRequest, ManualClock
from plugmq.plugins.store_rocks.store import RocksStore
from tests.helpers.stores import stored_at


def _open(tmp_path: Path, clock: ManualClock, **options: object) -> RocksStore:
    store = open_store("store_rocks", tmp_path, clock=clock, options=options)
    assert isinstance(store, RocksStore)
    return store


def test_without_wal_flush_makes_it_durable(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, flush="async", disable_wal=True)
    results = [store.append(AppendRequest("NoWal", i % 2, f"m{i}".encode())) for i in range(20)]
    store.flush()
    store.close()
    store = _open(tmp_path, clock, flush="async", disable_wal=True)
    assert [stored_at(store, r.commit_log_offset).body for r in results] == [f"m{i}".encode() for i in range(20)]
    assert store.max_offset("NoWal", 0) == 10
    store.close()


def test_damaged_sst_block_is_cut_and_offsets_never_reused(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, flush="sync")
    results = [store.append(AppendRequest("Sst", 0, f"sst-{i}-".encode() * 30)) for i in range(12)]
    end = store.stats()["next_commit_log_offset"]
    store.close()
    hits = 0
    for sst in (tmp_path / "store_rocks" / "db").glob("*.sst"):
        data = bytearray(sst.read_bytes())
        pos = data.find(b"sst-11-" * 30)
        if pos >= 0:
            data[pos + 3] ^= 0xFF
            sst.write_bytes(bytes(data))
            hits += 1
    assert hits == 1
    store = _open(tmp_path, clock, flush="sync")
    kept = store.max_offset("Sst", 0)
    assert kept < 12
    for r in results[:kept]:
        assert stored_at(store, r.commit_log_offset).body.startswith(f"sst-{r.queue_offset}-".encode())
    assert all(store.read(r.commit_log_offset) is None for r in results[kept:])
    res = store.append(AppendRequest("Sst", 0, b"after"))
    assert res.queue_offset == kept and res.commit_log_offset >= end, "a cut offset must not name a new message"
    store.close()
