"""store_lmdb beyond the shared suite and test_store_kv.py: map growth and its cap, damaged records, long
keys, store time, group commit."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import lmdb
import pytest

from plugmq.broker.components import open_store
from plugmq.core import AppendRequest, AppendResult, ManualClock, Prop, StoreError
from plugmq.core.errors import StoreFullError
from plugmq.kit.kvstore import codec
from plugmq.kit.kvstore.groupcommit import GroupCommit
from plugmq.plugins.store_lmdb.store import LmdbStore
from plugmq.testing import wait_for
from tests.helpers.stores import stored_at


def _open(tmp_path: Path, clock: ManualClock, **options: object) -> LmdbStore:
    store = open_store("store_lmdb", tmp_path, clock=clock, options=options)
    assert isinstance(store, LmdbStore)
    return store


def test_map_grows_without_losing_a_write(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, flush="async", map_size=1 << 20)
    written: list[tuple[AppendRequest, AppendResult]] = []
    for i in range(40):
        batch = [AppendRequest("Grow", i % 2, bytes([i]) * 20_000) for _ in range(3)]
        written += zip(batch, store.append_batch(batch))
    stats = store.stats()
    assert stats["map_grows"] >= 2 and stats["map_size"] >= 4 << 20
    for req, res in written:
        assert stored_at(store, res.commit_log_offset).body == req.body
    store.close()
    store = _open(tmp_path, clock, flush="async", map_size=1 << 20)  # a grown map opens as grown
    assert store.max_offset("Grow", 0) == 60
    store.close()


def test_map_cap_refuses_whole_batch_and_stays_usable(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, map_size=1 << 20, max_map_size=2 << 20)
    store.append(AppendRequest("Cap", 0, b"first"))
    with pytest.raises(StoreFullError, match="max_map_size"):
        store.append_batch([AppendRequest("Cap", 0, b"y" * 400_000) for _ in range(8)])
    assert store.max_offset("Cap", 0) == 1
    res = store.append(AppendRequest("Cap", 0, b"small"))
    assert res.queue_offset == 1 and stored_at(store, res.commit_log_offset).body == b"small"
    store.close()


def test_damaged_record_in_the_middle_is_never_returned(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock, verify_tail_records=2)
    results = [store.append(AppendRequest("Mid", 0, f"record-{i}-".encode() * 40)) for i in range(10)]
    store.close()
    victim = results[3]
    env = lmdb.open(str(tmp_path / "store_lmdb"), max_dbs=5)
    msg = env.open_db(b"msg")
    with env.begin(write=True, db=msg) as txn:  # a flipped bit inside the stored value
        raw = bytearray(txn.get(codec.OFFSET.pack(victim.commit_log_offset)))
        raw[-5] ^= 0x01
        txn.put(codec.OFFSET.pack(victim.commit_log_offset), bytes(raw))
    env.close()
    store = _open(tmp_path, clock, verify_tail_records=2)
    assert store.read(victim.commit_log_offset) is None
    assert store.stats()["corrupt_records"] == 1
    assert store.max_offset("Mid", 0) == 10, "outside the verified tail nothing is cut"
    assert all(store.read(r.commit_log_offset) is not None for r in results if r is not victim)
    store.close()


def test_long_keys_are_indexed_by_digest(tmp_path: Path, clock: ManualClock) -> None:
    store = _open(tmp_path, clock)
    long_key = "k" * 600  # beyond LMDB's 511-byte key limit if stored as is
    other = "k" * 599 + "j"
    a = store.append(AppendRequest("Keys", 0, b"a", properties={Prop.KEYS: long_key}))
    store.append(AppendRequest("Keys", 0, b"b", properties={Prop.KEYS: other}))
    assert [m.commit_log_offset for m in store.query_by_key("Keys", long_key)] == [a.commit_log_offset]
    store.close()


class _SteppingClock(ManualClock):
    """A clock that can be put back in time, like a wall clock corrected by NTP."""

    def rewind(self, seconds: float) -> None:
        self._now -= seconds


def test_store_time_never_goes_backwards(tmp_path: Path) -> None:
    clock = _SteppingClock()
    store = open_store("store_lmdb", tmp_path, clock=clock)
    first = store.append(AppendRequest("Time", 0, b"1"))
    clock.rewind(3600)
    second = store.append(AppendRequest("Time", 0, b"2"))
    assert second.store_timestamp_ms == first.store_timestamp_ms
    assert store.offset_for_timestamp("Time", 0, first.store_timestamp_ms) == 0
    store.close()


def test_group_commit_takes_every_waiting_batch_in_one_call() -> None:
    calls: list[list[list[int]]] = []

    def commit(batches):
        calls.append([list(b) for b in batches])
        return [[x * 10 for x in b] for b in batches]

    group = GroupCommit(commit)
    results: dict[int, list[int]] = {}
    with group.exclusive():  # hold the writer's seat while five batches queue up
        threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, group.submit([n, n + 100])))
                   for n in range(5)]
        for t in threads:
            t.start()
        wait_for(lambda: len(group._queue), 10, "five batches queued behind the held seat", until=lambda n: n >= 5,
                 interval=0.001)
        assert len(group._queue) == 5
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(calls[0]) == [[n, n + 100] for n in range(5)]
    assert results == {n: [n * 10, (n + 100) * 10] for n in range(5)}


def test_group_commit_failure_reaches_every_member() -> None:
    def on_fire(batches: list[Sequence[int]]) -> list[list[int]]:
        raise StoreError("disk on fire")

    group: GroupCommit[int, int] = GroupCommit(on_fire)
    with pytest.raises(StoreError, match="disk on fire"):
        group.submit([1])

