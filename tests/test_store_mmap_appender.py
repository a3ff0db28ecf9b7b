"""store_mmap's append kernels: the compiled one (``_appender.c``) and the pure-Python one.

Both must write the same bytes into the same files for the same requests (that makes the
Python one a reference for the C one), refuse a bad batch before writing anything, take
batches that mix topics and queues, stay consistent with concurrent writers, and leave a torn
batch tail that recovery cuts.
"""

from __future__ import annotations

import random
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from plugmq.core import AppendRequest, AppendResult, ManualClock, Prop, StoreError, ValidationError
from plugmq.core.errors import InvalidNameError, MessageTooLargeError
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap import appender as appender_module
from plugmq.plugins.store_mmap.appender import compiled_kernel
from plugmq.plugins.store_mmap.keyhash import index_key_hashes
from tests.helpers.mmap_workload import HOST, SMALL, files, run, workload
from tests.helpers.stores import stored_at

KERNELS = ("c", "python")


def make(path: Path, kernel: str, clock: ManualClock | None = None, **opts: Any) -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, "append_kernel": kernel, **opts})
    return MmapMessageStore(path, options, clock=clock or ManualClock(1_700_000_000.0), store_host=HOST)


# -- the compiled kernel is there and computes what Python does --------------------------------


def test_compiled_kernel_is_built() -> None:
    assert compiled_kernel() is not None, (
        "plugmq.plugins.store_mmap._appender was not built: reinstall with a C compiler and the Python "
        "headers (bash scripts/setup.sh or pip install -e .)"
    )


# -- byte for byte ---------------------------------------------------------------------------------


def test_kernels_write_identical_files(tmp_path: Path) -> None:
    """Segment roll-overs, consume-queue file switches, new queues, non-IPv4 born hosts,
    surrogates, multi-key indexes: the two kernels leave the same files and results."""
    requests = workload(7, 600)
    outcome = {}
    for kernel in KERNELS:
        store = make(tmp_path / kernel, kernel, preallocate_next_segment=False)  # no file made by a thread
        results = run(store, requests, random.Random(3))
        reads = [store.read(r.commit_log_offset) for r in results]
        hits = store.query_by_key("TopicA", "k\U0001f600")
        stats = store.stats()
        store.close()
        outcome[kernel] = (results, reads, [m.commit_log_offset for m in hits], files(tmp_path / kernel), stats)
    c, py = outcome["c"], outcome["python"]
    assert c[0] == py[0], "results differ"
    assert c[1] == py[1], "stored messages differ"
    assert c[2] == py[2] and c[2], "key queries differ"
    assert c[3].keys() == py[3].keys()
    for name in c[3]:
        assert c[3][name] == py[3][name], f"{name} differs between the kernels"
    assert c[4]["segments"] > 2, "the workload should roll the commit log"
    for req, res, msg in zip(requests, c[0], c[1], strict=True):
        assert msg is not None and msg.body == req.body and msg.queue_offset == res.queue_offset


def test_index_hashes_match_the_reference(tmp_path: Path) -> None:
    """The compiled kernel hashes ``topic#key`` itself; it must equal the numpy reference."""
    store = make(tmp_path / "s", "c")
    keys = ["plain", "\u00e9t\u00e9", "\U0001f600x", "\ud800", "a" * 200]
    store.append_batch([AppendRequest("T", 0, b"x", properties={Prop.KEYS: f"{k}\u2003{k}2", Prop.UNIQ_KEY: f"u-{k}"})
                        for k in keys])
    appender = store._appender
    hashes, _, _ = appender.pending_entries(appender.take_pending())
    expected = index_key_hashes([t for k in keys for t in (f"T#{k}", f"T#{k}2", f"T#u-{k}")])
    assert hashes.tolist() == expected.tolist()
    store.close()


# -- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
def test_batch_mixes_topics_and_queues(tmp_path: Path, kernel: str) -> None:
    store = make(tmp_path / "s", kernel)
    store.append(AppendRequest("B", 1, b"first"))
    reqs = [AppendRequest(t, q, f"{t}-{q}-{i}".encode()) for i in range(30) for t, q in (("A", 0), ("B", 1), ("A", 2))]
    results = store.append_batch(reqs)
    per_queue: dict[tuple[str, int], list[int]] = {}
    for req, res in zip(reqs, results, strict=True):
        per_queue.setdefault((req.topic, req.queue_id), []).append(res.queue_offset)
        assert stored_at(store, res.commit_log_offset).body == req.body
    assert per_queue == {("A", 0): list(range(30)), ("B", 1): list(range(1, 31)), ("A", 2): list(range(30))}
    phys = [r.commit_log_offset for r in results]
    assert phys == sorted(phys) and len({r.store_timestamp_ms for r in results}) == 1
    store.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_refused_batch_writes_nothing(tmp_path: Path, kernel: str) -> None:
    store = make(tmp_path / "s", kernel, index_max_entries=2000)
    good = [AppendRequest("T", 0, b"ok", properties={Prop.KEYS: "k"}) for _ in range(3)]
    bad_value = AppendRequest("T", 1, b"x", properties={"p": "v"})
    object.__setattr__(bad_value, "properties", {"p": 5})
    separator = AppendRequest("T", 1, b"x")
    object.__setattr__(separator, "properties", {"p": "a\x01b"})
    negative = AppendRequest("T", 1, b"x")
    object.__setattr__(negative, "queue_id", -1)
    huge = AppendRequest("T", 1, b"x")
    object.__setattr__(huge, "tags_code", 2**64)
    sneaky = AppendRequest("T", 1, b"x")
    object.__setattr__(sneaky, "topic", "../escape")
    too_big = AppendRequest("T", 1, b"x" * (4 * 1024 * 1024 + 1))
    too_long = AppendRequest("T", 1, b"x" * 70_000)
    cases = [(bad_value, ValidationError), (separator, ValidationError), (negative, ValidationError),
             (huge, ValidationError), (sneaky, InvalidNameError), (too_big, MessageTooLargeError),
             (too_long, StoreError)]
    before = store.stats()
    for bad, error in cases:
        with pytest.raises(error):
            store.append_batch([*good, bad, *good])
    after = store.stats()
    assert after["messages_appended"] == before["messages_appended"] == 0
    assert after["commit_log_max_offset"] == before["commit_log_max_offset"]
    assert store.max_offset("T", 0) == 0 and after["index_pending"] == 0
    assert store.append_batch(good)[-1].queue_offset == 2
    store.close()


# -- concurrency ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("flush", ["async", "sync"])
def test_concurrent_single_and_batch_writers(tmp_path: Path, kernel: str, flush: str) -> None:
    store = make(tmp_path / "s", kernel, flush=flush, index_max_entries=5000)
    written: list[tuple[AppendRequest, AppendResult]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        rng = random.Random(w)
        try:
            for i in range(60):
                reqs = [AppendRequest(f"T{rng.randrange(2)}", rng.randrange(3), f"{w}-{i}-{k}".encode() * 20,
                                      properties={Prop.KEYS: f"w{w}"})
                        for k in range(rng.choice([1, 1, 5, 20]))]
                results = store.append_batch(reqs) if len(reqs) > 1 else [store.append(reqs[0])]
                with lock:
                    written.extend(zip(reqs, results))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    by_queue: dict[tuple[str, int], dict[int, AppendResult]] = {}
    for req, res in written:
        assert stored_at(store, res.commit_log_offset).body == req.body
        slot = by_queue.setdefault((req.topic, req.queue_id), {})
        assert res.queue_offset not in slot
        slot[res.queue_offset] = res
    for (topic, qid), offsets in by_queue.items():
        assert sorted(offsets) == list(range(len(offsets)))
        entries = store.read_queue(topic, qid, 0, 10_000)
        assert [e.commit_log_offset for e in entries] == [offsets[i].commit_log_offset for i in range(len(offsets))]
    assert len(store.query_by_key("T0", "w1", max_results=10_000)) == sum(
        1 for req, _ in written if req.topic == "T0" and req.properties[Prop.KEYS] == "w1")
    store.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_writers_meeting_new_topics_and_queues_wait_for_each_other(tmp_path: Path, kernel: str) -> None:
    """The first append to a topic or queue calls back into Python (names learned, files made),
    where another thread may run: its append must wait for the put lock, not fail as a re-entry."""
    store = make(tmp_path / "s", kernel)
    errors: list[BaseException] = []
    written: list[tuple[AppendRequest, AppendResult]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            for i in range(40):
                reqs = [AppendRequest(f"N{w}_{i}", q, f"{w}-{i}-{q}".encode()) for q in range(4)]
                results = [store.append(reqs[0]), *store.append_batch(reqs[1:])]
                with lock:
                    written.extend(zip(reqs, results))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    try:
        assert not errors, errors[:3]
        assert len(written) == 4 * 40 * 4
        for req, res in written:
            assert stored_at(store, res.commit_log_offset).body == req.body
            assert res.queue_offset == 0
    finally:
        store.close()


# -- crash recovery ------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
def test_torn_batch_tail_is_cut_at_open(tmp_path: Path, kernel: str) -> None:
    """A process that dies while a batch is being copied leaves its first records whole and the
    rest torn: a copy of the files of a store that is still open, with the last records of its
    last batch damaged, is that state. Opening it keeps the whole records and cuts the rest."""
    live = make(tmp_path / "live", kernel, index_max_entries=2000)
    first = live.append_batch([AppendRequest("T", i % 2, f"early-{i}".encode() * 10) for i in range(20)])
    batch = live.append_batch([AppendRequest("T", i % 2, f"late-{i}".encode() * 10,
                                             properties={Prop.KEYS: f"late{i}"}) for i in range(10)])
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "live", crashed)  # 'abort' is in it: the store was not closed
    live.close()
    torn_at = batch[6].commit_log_offset
    segment = sorted((crashed / "commitlog").iterdir())[0]
    data = bytearray(segment.read_bytes())
    data[torn_at + 120 : batch[-1].commit_log_offset + batch[-1].size] = bytes(
        batch[-1].commit_log_offset + batch[-1].size - torn_at - 120)
    segment.write_bytes(bytes(data))

    store = make(crashed, kernel, index_max_entries=2000)
    assert store.recovery.crashed and store.recovery.end == torn_at
    survivors = [*first, *batch[:6]]
    for res in survivors:
        assert store.read(res.commit_log_offset) is not None
    for res in batch[6:]:
        assert store.read(res.commit_log_offset) is None
    assert store.max_offset("T", 0) == 13 and store.max_offset("T", 1) == 13
    assert [m.body for m in store.query_by_key("T", "late5")] == [b"late-5" * 10]
    assert store.query_by_key("T", "late6") == []
    nxt = store.append_batch([AppendRequest("T", 0, b"after"), AppendRequest("T", 1, b"after")])
    assert [r.queue_offset for r in nxt] == [13, 13] and nxt[0].commit_log_offset == torn_at
    store.close()


# -- the option ------------------------------------------------------------------------------------


def test_kernel_c_refused_when_not_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appender_module, "compiled_kernel", lambda: None)
    with pytest.raises(StoreError, match="not built"):
        make(tmp_path / "c", "c")
    store = make(tmp_path / "auto", "auto")  # falls back, with a warning
    assert type(store._appender).__name__ == "PyAppender"
    store.close()
