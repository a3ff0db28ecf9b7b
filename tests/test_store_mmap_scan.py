"""store_mmap's recovery scan kernels: the compiled one (``_scan.c``) and the pure-Python one.

Both must find the same end of the log, skip the same damage, report the same records (rows for
the consume queues, index entries for the key index) and judge consume-queue entries alike; the
Python one is the reference. A store recovered with either leaves byte-identical files.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, AppendResult, ConfigError, ManualClock, Prop, StoreError
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap import scan as scan_module
from plugmq.plugins.store_mmap.consumequeue import ENTRY_SIZE
from plugmq.plugins.store_mmap.indexfile import key_entries
from plugmq.plugins.store_mmap.record import HEADER_SIZE
from plugmq.plugins.store_mmap.scan import PyScanKernel, compiled_scan_kernel, make_scan_kernel, scan_log
from tests.helpers.mmap_workload import HOST, SMALL, files, run, workload

KERNELS = ("c", "python")


def make(path: Path, scan_kernel: str = "auto", **opts: Any) -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, "scan_kernel": scan_kernel, "preallocate_next_segment": False, **opts})
    return MmapMessageStore(path, options, clock=ManualClock(1_700_000_000.0), store_host=HOST)


def filled(path: Path, count: int = 600, seed: int = 7) -> list[AppendResult]:
    store = make(path)
    results = run(store, workload(seed, count), random.Random(3))
    # keys split on Unicode white space (as str.split()), an empty KEYS, a key of astral characters
    for keys in ("a\u2003b\u3000c\x1fd", "", "\U0001f600\U0001f601 \t x"):
        results.append(store.append(AppendRequest("TopicA", 0, b"k", properties={Prop.KEYS: keys})))
    store.close()
    return results


def flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


def test_compiled_scan_is_built() -> None:
    assert compiled_scan_kernel() is not None, (
        "plugmq.plugins.store_mmap._scan was not built: reinstall with a C compiler and the Python headers "
        "(bash scripts/setup.sh or pip install -e .)"
    )


def _isal_installed() -> bool:
    try:
        ctypes.CDLL("libisal.so.2")
    except OSError:
        return False
    return True


def test_the_crc_is_isal_where_it_is_installed() -> None:
    """The kernel computes CRC-32 with ISA-L when its library loads (no silent zlib fallback)."""
    expected = "isa-l" if _isal_installed() else "zlib"
    implementation = compiled_scan_kernel().CRC32
    assert implementation == expected, "libisal2 (Debian) gives the scan kernel a hardware CRC-32"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000), value=st.integers(0, 0xFFFFFFFF), skip=st.integers(0, 15))
def test_the_kernels_crc_is_zlibs(data: bytes, value: int, skip: int) -> None:
    """Any bytes, any starting CRC, any alignment: the CRC the record checks use is zlib.crc32's."""
    view = memoryview(data)[min(skip, len(data)):]
    assert compiled_scan_kernel().crc32(view, value) == zlib.crc32(view, value)
    assert compiled_scan_kernel().crc32(data) == zlib.crc32(data)


def scan_both(store: MmapMessageStore, begin: int, **kw: object) -> dict[str, scan_module.LogScan]:
    return {name: scan_log(store.commit_log, kernel, begin, **kw)  # type: ignore[arg-type]
            for name, kernel in (("c", compiled_scan_kernel()), ("python", PyScanKernel()))}


def same(a: scan_module.LogScan, b: scan_module.LogScan) -> None:
    assert (a.end, a.damage, a.count, a.last_ts, a.topics) == (b.end, b.damage, b.count, b.last_ts, b.topics)
    assert a.rows.tolist() == b.rows.tolist()
    assert a.keys.tolist() == b.keys.tolist()


def test_kernels_find_the_same_records_and_keys(tmp_path: Path) -> None:
    """Segment roll-overs (blank markers), three topics, keys with non-ASCII, surrogates and
    Unicode white space, unique ids: rows and index entries equal, and equal to decoding each
    record in Python and hashing its keys as the append path does."""
    results = filled(tmp_path / "s")
    store = make(tmp_path / "s")
    cl = store.commit_log
    for keys in (0, 1, 2):
        found = scan_both(store, cl.min_offset, rows=True, keys=keys)
        same(found["c"], found["python"])
    scan = found["c"]
    assert scan.end == cl.wrote and scan.count == len(results) and not scan.damage
    assert len(cl.segments) > 2, "the workload should roll the commit log"
    records = [cl.read(int(phys)) for phys in scan.rows[:, 0]]
    expected_rows = [(r.phys, r.total, r.queue_id, r.queue_offset, r.tags_code, r.store_ts, scan.topics.index(r.topic))
                     for r in records if r is not None]
    assert scan.rows.tolist() == [list(row) for row in expected_rows]
    pending = [(r.topic, r.properties().get("KEYS"), r.properties().get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX"), r.phys,
                r.store_ts) for r in records if r is not None]
    hashes, phys, stamps = key_entries(pending)
    assert scan.keys.tolist() == np.stack([hashes, phys, stamps], axis=1).tolist()
    assert len(scan.keys) > len(results) // 2
    # limits stop at the first record boundary at or past them
    middle = int(scan.rows[len(scan.rows) // 2, 0]) + 1
    limited = scan_both(store, cl.min_offset, limit=middle, rows=True)
    same(limited["c"], limited["python"])
    assert limited["c"].end == int(scan.rows[len(scan.rows) // 2 + 1, 0])
    store.close()


@pytest.mark.parametrize("where", ["middle", "tail"])
def test_kernels_skip_the_same_damage(tmp_path: Path, where: str) -> None:
    filled(tmp_path / "s", 300)
    store = make(tmp_path / "s")
    whole = scan_log(store.commit_log, PyScanKernel(), store.commit_log.min_offset, rows=True)
    store.close()
    row = whole.rows[len(whole.rows) // 3] if where == "middle" else whole.rows[-1]
    phys = int(row[0])
    segment = max(p for p in (tmp_path / "s" / "commitlog").iterdir() if int(p.name) <= phys)
    flip(segment, phys - int(segment.name) + HEADER_SIZE - 5)  # the tags code: only the record CRC notices
    store = make(tmp_path / "s")
    cl = store.commit_log
    found = scan_both(store, cl.min_offset, rows=True, keys=2)
    same(found["c"], found["python"])
    scan = found["c"]
    assert phys not in scan.rows[:, 0].tolist()
    if where == "middle":
        assert len(scan.damage) == 1 and scan.damage[0].start == phys and scan.count == whole.count - 1
    else:
        assert scan.end == phys and not scan.damage
    store.close()


def test_kernels_judge_queue_entries_alike(tmp_path: Path) -> None:
    filled(tmp_path / "s", 400)
    store = make(tmp_path / "s")
    cq = max(store.consume_queues, key=lambda q: q.max_offset)
    store.close()
    rng = random.Random(5)
    victims = sorted(rng.sample(range(cq.max_offset), 9))
    for qoff in victims:
        path = cq.dir / f"{qoff // cq.per_file * cq.per_file * ENTRY_SIZE:020d}"
        flip(path, qoff % cq.per_file * ENTRY_SIZE + rng.randrange(ENTRY_SIZE))
    store = make(tmp_path / "s")  # a clean stop: entries are not checked at open
    cl = store.commit_log
    queue = store.consume_queues.get(cq.topic, cq.queue_id)
    assert queue is not None
    segments = [(s.start, s.size, s.mm) for s in cl.segments]
    verdicts = {}
    for name, kernel in (("c", compiled_scan_kernel()), ("python", PyScanKernel())):
        bad = []
        for first in range(0, queue.max_offset, queue.per_file):
            f = queue.files[first // queue.per_file]
            count = min(queue.per_file, queue.max_offset - first)
            ok = kernel.check_entries(f.mm[: count * ENTRY_SIZE], first, queue.queue_id, cl.wrote, segments)
            bad += [first + i for i, sound in enumerate(ok) if not sound]
        verdicts[name] = bad
    del segments
    assert verdicts["c"] == verdicts["python"] == victims
    store.close()


@pytest.mark.parametrize("damage", ["torn_checkpoint", "queue_bits"])
def test_recovery_with_either_kernel_leaves_identical_files(tmp_path: Path, damage: str) -> None:
    filled(tmp_path / "base", 500)
    if damage == "torn_checkpoint":  # a crash without a checkpoint: everything re-dispatched and checked
        (tmp_path / "base" / "checkpoint").write_bytes(b"\xff" * 4096)
    else:  # a crash with flipped bits in a consume queue: entries checked and rebuilt from the log
        queue_file = sorted((tmp_path / "base" / "consumequeue").rglob("0" * 20))[0]
        for at in (3, 45, 107):
            flip(queue_file, at)
    (tmp_path / "base" / "abort").write_text("killed")
    outcome = {}
    for kernel in KERNELS:
        shutil.copytree(tmp_path / "base", tmp_path / kernel)
        store = make(tmp_path / kernel, kernel)
        report = store.recovery
        hits = [m.commit_log_offset for m in store.query_by_key("TopicA", "k1")]
        store.close()
        outcome[kernel] = (report, hits, files(tmp_path / kernel))
    c, py = outcome["c"], outcome["python"]
    assert c[0] == py[0] and c[1] == py[1] and c[1]
    assert c[0].crashed and c[0].queue_entries_checked > 0
    if damage == "queue_bits":
        assert c[0].queue_entries_repaired == 3
    else:
        assert c[0].redispatched == 503
    assert c[2].keys() == py[2].keys()
    for name in c[2]:
        assert c[2][name] == py[2][name], f"{name} differs between the kernels"


def test_scan_kernel_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="scan_kernel"):
        MmapStoreOptions(scan_kernel="fast")
    monkeypatch.setattr(scan_module, "compiled_scan_kernel", lambda: None)
    with pytest.raises(StoreError, match="not built"):
        make(tmp_path / "c", "c")
    assert isinstance(make_scan_kernel("auto"), PyScanKernel)  # falls back, with a warning
