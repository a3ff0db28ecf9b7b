"""store_mmap flushing: group commit, FLUSH_DISK_TIMEOUT, the background flusher, checkpoints.

The flush paths run on real threads and real fsyncs. To make a flush slow deterministically the
tests hold the commit log's flush lock (the lock every flush of the commit log takes): while it
is held, no flush can complete, whatever the machine's speed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plugmq.core import AppendRequest, AppendResult, AppendStatus, ManualClock
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.checkpoint import Checkpoint, CheckpointData
from plugmq.testing import wait_for
from tests.helpers.stores import stored_at

HOST = "10.0.0.7:10911"
SMALL: dict[str, Any] = {"commit_log_segment_size": 256 * 1024, "consume_queue_entries_per_file": 64, "index_slot_count": 64,
             "index_max_entries": 100}


def make(path: Path, **opts: Any) -> MmapMessageStore:
    return MmapMessageStore(path, MmapStoreOptions(**{**SMALL, **opts}), clock=ManualClock(), store_host=HOST)


def req(i: int, qid: int = 0) -> AppendRequest:
    return AppendRequest(topic="F", queue_id=qid, body=f"message-{i}".encode() * 10)


def read_checkpoint(path: Path) -> CheckpointData | None:
    ckpt = Checkpoint(path / "checkpoint")
    try:
        return ckpt.read()
    finally:
        ckpt.close()


def run_threads(n: int, work: Callable[[int], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    return threads


def test_one_flush_covers_every_waiting_writer(tmp_path: Path) -> None:
    store = make(tmp_path / "s", flush="sync", sync_flush_timeout_ms=60_000)
    try:
        results: dict[int, AppendResult] = {}
        cl = store.commit_log
        with cl.flush_lock:  # the flush cannot start: all 8 writers queue up behind it
            flushes_before = cl.flush_count
            threads = run_threads(8, lambda t: results.__setitem__(t, store.append(req(t, t % 2))))
            wait_for(lambda: store.stats()["messages_appended"] == 8, 30, "8 appended messages")
            assert cl.flushed < cl.wrote
        for t in threads:
            t.join()
        assert [results[t].status for t in range(8)] == [AppendStatus.PUT_OK] * 8
        assert cl.flush_count == flushes_before + 1, "one group commit must cover all eight writers"
        assert cl.flushed == cl.wrote
    finally:
        store.close()


def test_sync_flush_with_many_writers(tmp_path: Path) -> None:
    store = make(tmp_path / "s", flush="sync")
    per_thread = 40
    results: dict[int, list] = {t: [] for t in range(6)}

    def writer(t: int) -> None:
        for i in range(per_thread):
            if i % 5 == 0:
                results[t] += store.append_batch([req(1000 * t + i + k, t % 3) for k in range(3)])
            else:
                results[t].append(store.append(req(1000 * t + i, t % 3)))

    try:
        for t in run_threads(6, writer):
            t.join()
        everything = [r for rs in results.values() for r in rs]
        assert all(r.status is AppendStatus.PUT_OK for r in everything)
        assert len({r.commit_log_offset for r in everything}) == len(everything)
        assert store.commit_log.flushed >= max(r.commit_log_offset + r.size for r in everything)
        stats = store.stats()
        assert stats["flushes"] <= stats["messages_appended"] and stats["flush_disk_timeouts"] == 0
        for qid in range(3):
            offsets = sorted(r.queue_offset for t, rs in results.items() if t % 3 == qid for r in rs)
            assert offsets == list(range(len(offsets)))
    finally:
        store.close()


def test_flush_that_does_not_complete_in_time_reports_flush_disk_timeout(tmp_path: Path) -> None:
    store = make(tmp_path / "s", flush="sync", sync_flush_timeout_ms=50)
    try:
        cl = store.commit_log
        with cl.flush_lock:
            single = store.append(req(1))
            batch = store.append_batch([req(2), req(3, 1)])
            others: dict[int, AppendResult] = {}
            for t in run_threads(3, lambda t: others.__setitem__(t, store.append(req(10 + t)))):
                t.join()
        statuses = [single.status, *(r.status for r in batch), *(r.status for r in others.values())]
        assert statuses == [AppendStatus.FLUSH_DISK_TIMEOUT] * 6, "never a silent success"
        assert store.stats()["flush_disk_timeouts"] == 5  # one per wait: the batch waits once
        assert stored_at(store, single.commit_log_offset).body == req(1).body, "stored, just not known durable"
        after = store.append(req(4))
        assert after.status is AppendStatus.PUT_OK
        assert cl.flushed == cl.wrote >= single.commit_log_offset + single.size
    finally:
        store.close()


def test_background_flusher_and_checkpoint(tmp_path: Path) -> None:
    store = make(tmp_path / "s", flush="async", flush_interval_ms=5, flush_least_pages=0,
                 derived_flush_interval_ms=5)
    try:
        results = [store.append(req(i, i % 2)) for i in range(50)]
        assert all(r.status is AppendStatus.PUT_OK for r in results)
        end = results[-1].commit_log_offset + results[-1].size
        wait_for(lambda: store.commit_log.flushed == end, 30, "the flush thread")
        wait_for(lambda: getattr(read_checkpoint(tmp_path / "s"), "consume_queue_offset", -1), 30,
                 "a checkpoint covering the consume queues", until=lambda covered: covered == end)
    finally:
        store.close()


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_explicit_flush_and_close_write_the_checkpoint(tmp_path: Path, flush: str) -> None:
    store = make(tmp_path / "s", flush=flush, flush_interval_ms=60_000, derived_flush_interval_ms=60_000)
    for i in range(30):
        store.append(AppendRequest(topic="F", queue_id=0, body=b"x", properties={"KEYS": f"k{i}"}))
    store.flush()
    end = store.commit_log.wrote
    data = read_checkpoint(tmp_path / "s")
    assert data is not None
    assert (data.commit_log_offset, data.consume_queue_offset, data.index_offset) == (end, end, end)
    assert store.stats()["index_pending"] == 0
    store.close()
    assert not (tmp_path / "s" / "abort").exists()


def test_a_failure_that_keeps_coming_back_is_logged_once_then_its_recovery(tmp_path: Path) -> None:
    """The flush thread survives a failing round; the same failure every tick (a data dir deleted
    under the store, say) is one traceback, not one per tick, and the recovery is said."""
    from structlog.testing import capture_logs

    from plugmq.plugins.store_mmap.flush import FlushService

    store = make(tmp_path / "s")
    rounds = {"failing": 0, "fine": 0}
    failing = threading.Event()
    failing.set()
    recovered = threading.Event()

    def housekeeping() -> None:
        if failing.is_set():
            rounds["failing"] += 1
            raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "gone"))
        rounds["fine"] += 1
        recovered.set()

    with capture_logs() as logs:
        flusher = FlushService(store._cl, flush_commit_log=False, interval_ms=1, least_pages=4,
                               thorough_interval_ms=1000, derived_interval_ms=1000,
                               flush_derived=lambda: None, housekeeping=housekeeping)
        flusher.start()
        try:
            # the real flush thread's ticks, not a delay under test
            wait_for(lambda: rounds["failing"], 20, "20 failing flush rounds", until=lambda failed: failed >= 20)
            failing.clear()
            assert recovered.wait(20)
        finally:
            flusher.stop()
            store.close()
    # Only this flusher's failure counts: a store another test left open may log from its own thread.
    ours = [e for e in logs if "gone" in str(e.get("error"))]
    failed = [e for e in ours if e["event"] == "background flush failed"]
    assert rounds["failing"] >= 20 and len(failed) == 1, ours
    assert [e["after_failures"] for e in ours if e["event"] == "background flush works again"] == [rounds["failing"]]
