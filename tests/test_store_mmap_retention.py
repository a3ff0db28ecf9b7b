"""store_mmap retention on a ManualClock: the delete hour, disk watermarks, readers keep mappings."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from plugmq.core import AppendRequest, ManualClock, Prop
from plugmq.core.errors import StoreFullError
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions

HOST = "10.0.0.7:10911"
SEG = 64 * 1024
NEVER = {"disk_max_used_ratio": 1.0, "disk_force_clean_ratio": 1.0, "disk_critical_ratio": 1.0}
SMALL: dict[str, Any] = dict(commit_log_segment_size=SEG, consume_queue_entries_per_file=8, index_slot_count=31,
             index_max_entries=20, file_reserved_hours=1, delete_when="04", **NEVER)


def local(hour: int, minute: int = 0) -> float:
    """Epoch seconds of a local wall-clock time (delete_when is a local hour, like RocketMQ)."""
    return dt.datetime(2023, 11, 14, hour, minute).timestamp()


def make(path: Path, clock: ManualClock, **opts: Any) -> MmapMessageStore:
    return MmapMessageStore(path, MmapStoreOptions(**{**SMALL, **opts}), clock=clock, store_host=HOST)


def write(store: MmapMessageStore, clock: ManualClock, first: int, n: int) -> list:
    out = []
    for i in range(first, first + n):
        out.append(store.append(AppendRequest(topic="R", queue_id=i % 2, body=bytes([i % 256]) * 3000,
                                              properties={Prop.KEYS: f"k{i}"})))
        clock.advance(1)
    return out


def check_queues(store: MmapMessageStore, expected_max: int) -> None:
    clmin = store.commit_log.min_offset
    for qid in (0, 1):
        low, high = store.min_offset("R", qid), store.max_offset("R", qid)
        assert high == expected_max
        entries = store.read_queue("R", qid, 0, 1000)
        assert [e.queue_offset for e in entries] == list(range(low, high)), "entries below min_offset returned"
        assert all(e.commit_log_offset >= clmin for e in entries)
        assert all(store.read(e.commit_log_offset) is not None for e in entries)


def test_expired_segments_go_only_at_the_delete_hour(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock)
    try:
        old = write(store, clock, 0, 100)  # ~5 segments at 01:00-01:02
        clock.set(local(2, 30))
        assert store.clean_expired(clock.now_ms()) == 0, "expired, but 02:30 is not the delete hour"
        assert all(store.read(r.commit_log_offset) is not None for r in old)
        clock.set(local(4, 5))
        removed = store.clean_expired(clock.now_ms())
        segments = store.commit_log.segments
        assert removed >= 4 and segments[0] is store.commit_log.cur, "all but the segment being written"
        gone = [r for r in old if r.commit_log_offset < segments[0].start]
        assert gone and all(store.read(r.commit_log_offset) is None for r in gone)
        check_queues(store, 50)
        assert store.query_by_key("R", "k3") == [] and len(store.query_by_key("R", "k99")) == 1
        assert len(list((tmp_path / "s" / "consumequeue" / "R" / "0").iterdir())) < 50 // 8
        fresh = write(store, clock, 100, 10)
        assert store.clean_expired(clock.now_ms()) == 0, "nothing else is older than an hour"
        assert all(store.read(r.commit_log_offset) is not None for r in fresh)
        mins = (store.min_offset("R", 0), store.min_offset("R", 1))
    finally:
        store.close()
    store = make(tmp_path / "s", clock)
    try:
        assert (store.min_offset("R", 0), store.min_offset("R", 1)) == mins
        check_queues(store, 55)
    finally:
        store.close()


def test_a_segment_expires_by_its_last_write(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock)
    try:
        early = write(store, clock, 0, 30)  # the first segment and part of the second, at 01:00
        clock.set(local(3, 30))
        write(store, clock, 30, 60)  # the second segment is finished at 03:30
        clock.set(local(4, 10))
        assert store.clean_expired(clock.now_ms()) >= 1
        assert store.commit_log.min_offset == SEG, "only the first segment's last write is over an hour ago"
        in_second = [r for r in early if r.commit_log_offset >= SEG]
        assert in_second and all(store.read(r.commit_log_offset) is not None for r in in_second)
        check_queues(store, 45)
    finally:
        store.close()


def test_disk_watermark_cleans_expired_at_once(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock, disk_max_used_ratio=0.0)  # any disk is "too full"
    try:
        write(store, clock, 0, 80)
        clock.set(local(1, 30))
        assert store.clean_expired(clock.now_ms()) == 0, "under pressure, but nothing has expired"
        clock.set(local(2, 30))
        assert store.clean_expired(clock.now_ms()) >= 3, "expired and over the watermark: no need to wait for 04"
        check_queues(store, 40)
    finally:
        store.close()


def test_force_watermark_removes_the_oldest_even_if_fresh(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock, disk_force_clean_ratio=0.0)
    try:
        write(store, clock, 0, 80)
        first_segments = len(store.commit_log.segments)
        assert store.clean_expired(clock.now_ms()) >= 1
        assert len(store.commit_log.segments) == first_segments - 1, "one segment per clean"
        check_queues(store, 40)
    finally:
        store.close()


def test_writes_refused_above_the_critical_watermark(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock, disk_critical_ratio=0.0)
    try:
        with pytest.raises(StoreFullError, match="disk_critical_ratio"):
            store.append(AppendRequest(topic="R", queue_id=0, body=b"x"))
        with pytest.raises(StoreFullError):
            store.append_batch([AppendRequest(topic="R", queue_id=0, body=b"x")])
        assert store.max_offset("R", 0) == 0 and store.stats()["messages_appended"] == 0
    finally:
        store.close()


def test_a_segment_being_read_is_not_unmapped_under_the_reader(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    store = make(tmp_path / "s", clock)
    try:
        results = write(store, clock, 0, 60)
        oldest = store.commit_log.segments[0]
        assert oldest.acquire(), "a reader holds the oldest segment"
        clock.set(local(4, 30))
        assert store.clean_expired(clock.now_ms()) >= 1
        assert not oldest.path.exists(), "the file is deleted at once"
        assert store.read(results[0].commit_log_offset) is None, "new readers no longer find it"
        assert not oldest.mm.closed and oldest.mm[:4] != b"\0\0\0\0", "the holder's mapping still works"
        oldest.release()
        assert oldest.mm.closed, "the last reader's release unmaps it"
    finally:
        store.close()
