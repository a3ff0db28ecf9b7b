"""store_mmap's bytes on disk do not change with its kernels' build: a store written before the
kernels moved to zlib's crc32 reads back whole, and the same requests written now give the same bytes."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tests.helpers.mmap_workload import files
from tests.helpers.store_mmap_reference import ARCHIVE, open_store, reference_requests, write_reference_store

KERNELS = ("c", "python")


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path / "store"


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_store_written_by_the_old_kernels_reads_back_whole(old_store: Path, kernel: str) -> None:
    """Every record of the old store passes the recovery scan's checks (both CRCs) and reads back
    as it was sent."""
    store = open_store(old_store, append_kernel=kernel, scan_kernel=kernel, recover_check_segments=99)
    try:
        report = store.recovery
        assert report.checked_from == 0, "the scan must check every record"
        assert (report.cut_bytes, report.damaged_ranges) == (0, 0), f"the scan refused old records: {report}"
        wanted: dict[tuple[str, int], list[bytes]] = {}
        for request in reference_requests():
            wanted.setdefault((request.topic, request.queue_id), []).append(request.body)
        for (topic, queue_id), bodies in wanted.items():
            entries = store.read_queue(topic, queue_id, 0, len(bodies) + 1)
            read = [store.read(e.commit_log_offset, e.size) for e in entries]
            assert [m.body for m in read if m is not None] == bodies, f"{topic}/{queue_id} reads back otherwise"
    finally:
        store.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_same_requests_written_now_give_the_same_bytes(old_store: Path, tmp_path: Path, kernel: str) -> None:
    written = tmp_path / "now"
    write_reference_store(written, kernel)
    old, new = files(old_store), files(written)
    assert old.keys() <= new.keys(), f"files missing: {sorted(old.keys() - new.keys())}"
    differing = [name for name in old if old[name] != new[name]]
    assert not differing, f"files differ from the store the old kernels wrote: {differing}"
    # A store may now open a queue's next file as soon as the current one is full: it holds no entry.
    assert all(not any(new[name]) for name in new.keys() - old.keys()), "a file the old store lacks holds data"
