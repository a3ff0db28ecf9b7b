"""What store_lmdb and store_rocks (both on the kit's key-value store base) share beyond the shared
suite: options refused, the flush mode, one opener, retention. Engine details stay in
test_store_lmdb.py and test_store_rocks.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plugmq.broker.components import open_store
from plugmq.core import AppendRequest, ConfigError, ManualClock, Prop, StoreError
from plugmq.kit.kvstore.base import KeyValueMessageStore
from plugmq.plugins.store_lmdb.store import LmdbStore
from plugmq.plugins.store_rocks.store import RocksStore

STORES = ["store_lmdb", "store_rocks"]

BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    *(("store_lmdb", bad) for bad in (
        {"flush": "sometimes"}, {"map_size": 1000}, {"map_size": 4 << 20, "max_map_size": 2 << 20},
        {"file_reserved_hours": 0}, {"flush_interval_ms": 0}, {"no_such_option": 1})),
    *(("store_rocks", bad) for bad in (
        {"flush": "eventually"}, {"flush": "sync", "disable_wal": True}, {"compression": "rar"},
        {"write_buffer_size": 10}, {"file_reserved_hours": -1}, {"verify_tail_records": -1})),
]


def _open(name: str, tmp_path: Path, clock: ManualClock, **options: object) -> KeyValueMessageStore[Any]:
    store = open_store(name, tmp_path, clock=clock, options=options)
    assert isinstance(store, KeyValueMessageStore)
    return store


def _lmdb_syncs(store: KeyValueMessageStore[Any], sync: bool) -> None:
    assert isinstance(store, LmdbStore)
    flags = store._env.flags()
    assert flags["sync"] is sync and flags["writemap"] is False and flags["map_async"] is False
    if sync:
        assert flags["metasync"] is True


def _rocks_syncs(store: KeyValueMessageStore[Any], sync: bool) -> None:
    assert isinstance(store, RocksStore)
    assert store._write_opts.sync is sync
    # rocksdict's stub declares disable_wal a method; at run time it is a bool attribute
    assert store._write_opts.disable_wal is False  # type: ignore[comparison-overlap]


#: How each engine is told to sync every write (or not): env flags, write options.
ENGINE_SYNCS: dict[str, Callable[[KeyValueMessageStore[Any], bool], None]] = {
    "store_lmdb": _lmdb_syncs, "store_rocks": _rocks_syncs}


@pytest.mark.parametrize(("name", "bad"), BAD_OPTIONS)
def test_invalid_options_refused(tmp_path: Path, clock: ManualClock, name: str, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        _open(name, tmp_path, clock, **bad)


@pytest.mark.parametrize("name", STORES)
@pytest.mark.parametrize(("flush", "sync"), [("sync", True), ("async", False)])
def test_flush_mode_maps_to_the_engines_sync(tmp_path: Path, clock: ManualClock, name: str, flush: str,
                                             sync: bool) -> None:
    store = _open(name, tmp_path, clock, flush=flush)
    try:
        ENGINE_SYNCS[name](store, sync)
        assert (store._flusher is None) is sync, "async mode needs the background flush thread"
    finally:
        store.close()


@pytest.mark.parametrize("name", STORES)
def test_second_opener_refused(tmp_path: Path, clock: ManualClock, name: str) -> None:
    store = _open(name, tmp_path, clock)
    try:
        with pytest.raises(StoreError, match="already open"):
            _open(name, tmp_path, clock)
    finally:
        store.close()
    _open(name, tmp_path, clock).close()  # released on close


def _index_entries(store: KeyValueMessageStore[Any]) -> int:
    with store._reading() as reader:
        return sum(1 for _ in reader.scan("idx"))


@pytest.mark.parametrize("name", STORES)
def test_retention_removes_old_records_and_their_entries(tmp_path: Path, clock: ManualClock, name: str) -> None:
    store = _open(name, tmp_path, clock, file_reserved_hours=1.0, retention_batch=3)
    old = [store.append(AppendRequest("Ret", i % 2, b"old", properties={Prop.KEYS: "k"})) for i in range(7)]
    clock.advance(1800)
    new = [store.append(AppendRequest("Ret", 0, b"new", properties={Prop.KEYS: "k"})) for _ in range(2)]
    clock.advance(1800 + 1)  # the old ones are now past one hour, the new ones not
    assert store.clean_expired(clock.now_ms()) == 7
    assert (store.min_offset("Ret", 0), store.max_offset("Ret", 0)) == (4, 6)
    assert (store.min_offset("Ret", 1), store.max_offset("Ret", 1)) == (3, 3)
    assert all(store.read(r.commit_log_offset) is None for r in old)
    assert [e.queue_offset for e in store.read_queue("Ret", 0, 0, 10)] == [4, 5]
    assert store.read_queue("Ret", 1, 0, 10) == []
    assert sorted(m.commit_log_offset for m in store.query_by_key("Ret", "k")) == [r.commit_log_offset for r in new]
    assert _index_entries(store) == 2, "index entries of expired messages must go too"
    store.close()
    store = _open(name, tmp_path, clock, file_reserved_hours=1.0)
    assert store.min_offset("Ret", 0) == 4 and store.offset_for_timestamp("Ret", 0, 0) == 4
    assert store.append(AppendRequest("Ret", 1, b"more")).queue_offset == 3
    store.close()
