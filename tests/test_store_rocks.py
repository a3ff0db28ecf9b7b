"""store_rocks beyond the shared suite: options, write options, WAL-less mode, retention, recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugmq.broker.components import open_store
from plugmq.core import AppendRequest, ConfigError, ManualClock, Prop, StoreError
from plugmq.plugins.store_rocks.store import RocksStore
from tests.helpers.stores import stored_at


def _open(tmp_path: Path, clock: ManualClock, **options: object) -> RocksStore:
    store = open_store("store_rocks", tmp_path, clock=clock, options=options)
    assert isinstance(store, RocksStore)
    return store


@pytest.mark.parametrize("bad", [
    {"flush": "eventually"}, {"flush": "sync", "disable_wal": True}, {"compression": "rar"},
    {"write_buffer_size": 10}, {"file_reserved_hours": -1}, {"verify_tail_records": -1},
])
def test_invalid_options_refused(tmp_path: Path, clock: ManualClock, bad: dict) -> None:
    with pytest.raises(ConfigError):
        _open(tmp_path, clock, **bad)


@pytest.mark.parametrize(("flush", "sync"), [("sync", True), ("async", False)])
def test_flush_mode_maps_to_write_options(tmp_path: Path, clock: ManualClock, flush: str, sync: bool) -> None:
    store = _open(tmp_path, clock, flush=flush)
    try:
        assert store._write_opts.sync is sync
        # rocksdict's stub declares disable_wal a method; at run time it is a bool attribute
        assert store._write_opts.disable_wal is False  # type: ignore[comparison-overlap]
        assert (store._flusher is None) is sync, "async mode needs the background flush_wal thread"
    finally:
        store.close()


def test_second_opener_refused(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock)
    try:
        with pytest.raises(StoreError, match="already open"):
            _open(tmp_path, clock)
    finally:
        store.close()
    _open(tmp_path, clock).close()


def test_without_wal_flush_makes_it_durable(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, flush="async", disable_wal=True)
    results = [store.append(AppendRequest("NoWal", i % 2, f"m{i}".encode())) for i in range(20)]
    store.flush()
    store.close()
    store = _open(tmp_path, clock, flush="async", disable_wal=True)
    assert [stored_at(store, r.commit_log_offset).body for r in results] == [f"m{i}".encode() for i in range(20)]
    assert store.max_offset("NoWal", 0) == 10
    store.close()


def test_retention_removes_old_records_and_their_entries(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, file_reserved_hours=1.0, retention_batch=3)
    old = [store.append(AppendRequest("Ret", i % 2, b"old", properties={Prop.KEYS: "k"})) for i in range(7)]
    clock.advance(1800)
    new = [store.append(AppendRequest("Ret", 0, b"new", properties={Prop.KEYS: "k"})) for _ in range(2)]
    clock.advance(1800 + 1)
    assert store.clean_expired(clock.now_ms()) == 7
    assert (store.min_offset("Ret", 0), store.max_offset("Ret", 0)) == (4, 6)
    assert (store.min_offset("Ret", 1), store.max_offset("Ret", 1)) == (3, 3)
    assert all(store.read(r.commit_log_offset) is None for r in old)
    assert [e.queue_offset for e in store.read_queue("Ret", 0, 0, 10)] == [4, 5]
    assert store.read_queue("Ret", 1, 0, 10) == []
    assert sorted(m.commit_log_offset for m in store.query_by_key("Ret", "k")) == [r.commit_log_offset for r in new]
    assert len(list(store._cf["idx"].keys())) == 2, "index entries of expired messages must go too"
    store.close()
    store = _open(tmp_path, clock, file_reserved_hours=1.0)
    assert store.min_offset("Ret", 0) == 4 and store.offset_for_timestamp("Ret", 0, 0) == 4
    assert store.append(AppendRequest("Ret", 1, b"more")).queue_offset == 3
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
