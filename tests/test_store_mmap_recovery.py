"""store_mmap recovery: SIGKILL of a real writer process, hand-damaged tails, torn checkpoints.

Run as a script (``python test_store_mmap_recovery.py child DIR FLUSH FIRST``) this file is the
writer child of the kill test: it appends forever and prints one line per acknowledged message.
"""

from __future__ import annotations

import hashlib
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugmq.conformance.storage import Opener, StoreConformance, StoreUnderTest
from plugmq.core import AppendRequest, Clock, ManualClock, Prop
from plugmq.core.clock import SystemClock
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.record import HEADER_SIZE, MESSAGE_MAGIC, decode
from tests.helpers.children import ROOT, child_command
from tests.helpers.stores import stored_at

HOST = "10.0.0.7:10911"
SEG = 64 * 1024
SMALL: dict[str, Any] = {"commit_log_segment_size": SEG, "consume_queue_entries_per_file": 64, "index_slot_count": 97,
             "index_max_entries": 300}
TOPIC = "Kill"
QUEUES = 3


def make(path: Path, clock: Clock | None = None, **opts: Any) -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, **opts})
    return MmapMessageStore(path, options, clock=clock or ManualClock(), store_host=HOST)


def body_for(index: int) -> bytes:
    size = (index * 7919) % 3000
    return index.to_bytes(8, "big") + hashlib.shake_128(f"mmap-kill:{index}".encode()).digest(size)


def index_of(body: bytes) -> int | None:
    if len(body) < 8:
        return None
    index = int.from_bytes(body[:8], "big")
    return index if body == body_for(index) else None


def request_for(index: int) -> AppendRequest:
    return AppendRequest(TOPIC, index % QUEUES, body_for(index),
                         properties={Prop.KEYS: f"k{index} shared", Prop.UNIQ_KEY: f"U{index:010d}"})


# -- the writer child -------------------------------------------------------------------------


def child(directory: str, flush: str, first: int) -> None:
    out = os.dup(1)
    os.dup2(2, 1)  # the store's logs go to stderr; stdout carries only acknowledgements
    # index_batch=1 indexes every message at once, so a kill leaves index entries past the
    # checkpoint for recovery to cut; the short derived interval moves checkpoints meanwhile.
    store = make(Path(directory), SystemClock(), flush=flush, index_batch=1, derived_flush_interval_ms=20,
                 flush_interval_ms=10)
    index = first
    while True:
        count = 1 + index % 4 if index % 3 == 0 else 1
        reqs = [request_for(index + k) for k in range(count)]
        results = store.append_batch(reqs) if count > 1 else [store.append(reqs[0])]
        os.write(out, "".join(f"{index + k} {r.commit_log_offset} {r.queue_offset}\n"
                              for k, r in enumerate(results)).encode())
        index += count


def run_and_kill(directory: Path, flush: str, first: int, acks: int, log: Path) -> dict[int, tuple[int, int]]:
    with open(log, "ab") as err:
        proc = subprocess.Popen(child_command(__file__, "child", str(directory), flush, str(first)),
                                stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
    assert proc.stdout is not None
    got = b""
    try:
        while got.count(b"\n") < acks:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                raise AssertionError(f"writer exited early ({proc.returncode}): {log.read_text()[-2000:]}")
            got += chunk
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    got += rest
    acked = {}
    for line in got.split(b"\n")[:-1]:
        index, clo, qoff = map(int, line.split())
        acked[index] = (clo, qoff)
    return acked


def check_consistent(store: MmapMessageStore) -> set[int]:
    """Every queue entry points at an intact record; the index holds exactly the log's keys."""
    seen: set[int] = set()
    for qid in range(QUEUES):
        low, high = store.min_offset(TOPIC, qid), store.max_offset(TOPIC, qid)
        entries = store.read_queue(TOPIC, qid, low, 10**6)
        assert [e.queue_offset for e in entries] == list(range(low, high)), f"queue {qid} has holes"
        for e in entries:
            msg = store.read(e.commit_log_offset)
            assert msg is not None and msg.queue_offset == e.queue_offset and msg.queue_id == qid
            index = index_of(msg.body)
            assert index is not None, "a damaged record came back"
            seen.add(index)
    keys_in_log: list[str] = []
    store.commit_log.walk(store.commit_log.min_offset, lambda rec: keys_in_log.extend(rec.keys_and_uniq()))
    entries_in_index = sum(f.count - 1 for f in store.index.files)
    assert entries_in_index == len(keys_in_log), "index entries past the end were not cut, or some are missing"
    return seen


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_sigkill_mid_write_loses_no_acknowledged_message(tmp_path: Path, flush: str) -> None:
    directory = tmp_path / "store"
    acked: dict[int, tuple[int, int]] = {}
    for round_no in range(2):
        acked.update(run_and_kill(directory, flush, round_no * 1_000_000, 400, tmp_path / "child.log"))
        store = make(directory)
        try:
            assert store.recovery.crashed, "the abort file must mark the kill"
            for index, (clo, qoff) in acked.items():
                msg = store.read(clo)
                assert msg is not None, f"acknowledged message {index} lost"
                assert index_of(msg.body) == index and msg.queue_offset == qoff
            seen = check_consistent(store)
            assert set(acked) <= seen
            for index in list(acked)[::37]:
                assert [index_of(m.body) for m in store.query_by_key(TOPIC, f"k{index}")] == [index]
                assert [index_of(m.body) for m in store.query_by_key(TOPIC, f"U{index:010d}")] == [index]
            assert len(list((directory / "commitlog").iterdir())) >= 2, "the run should cross segments"
        finally:
            store.close()
    store = make(directory)
    assert not store.recovery.crashed and store.recovery.redispatched == 0, "a clean restart trusts the checkpoint"
    store.close()


# -- damaged tails ----------------------------------------------------------------------------


def fill(directory: Path, n: int = 40) -> list:
    store = make(directory)
    results = [store.append(request_for(i)) for i in range(n)]
    store.close()
    return results


def segment_path(directory: Path, offset: int) -> tuple[Path, int]:
    start = offset // SEG * SEG
    return directory / "commitlog" / f"{start:020d}", offset - start


def flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0x40]))


def test_a_clean_restart_rechecks_only_the_newest_record(tmp_path: Path) -> None:
    """After a clean stop the checkpoint says where the log ends: recovery re-reads the newest
    record (found through its consume-queue entry), not the newest segment."""
    directory = tmp_path / "s"
    results = fill(directory, 60)
    last = results[-1]
    assert last.commit_log_offset >= SEG, "the log should reach a second segment"
    store = make(directory)
    try:
        report = store.recovery
        assert not report.crashed and report.checkpoint_valid
        assert (report.checked_from, report.end) == (last.commit_log_offset, last.commit_log_offset + last.size)
        assert report.redispatched == 0 and report.cut_bytes == 0
    finally:
        store.close()
    store = make(directory, recover_check_segments=1)  # RocketMQ's way, on request: the newest segment again
    try:
        assert store.recovery.checked_from == last.commit_log_offset // SEG * SEG
        assert index_of(stored_at(store, last.commit_log_offset).body) == 59
    finally:
        store.close()


@pytest.mark.parametrize("where", ["body", "store_timestamp", "properties", "total_size"])
def test_flipped_byte_in_last_record_is_cut(tmp_path: Path, where: str) -> None:
    directory = tmp_path / "s"
    results = fill(directory)
    last = results[-1]
    path, pos = segment_path(directory, last.commit_log_offset)
    offset_in_record = {"body": HEADER_SIZE + 20, "store_timestamp": 62, "properties": last.size - 6,
                        "total_size": 2}[where]
    flip(path, pos + offset_in_record)
    store = make(directory)
    try:
        assert store.recovery.end == last.commit_log_offset
        assert store.read(last.commit_log_offset) is None
        qid = 39 % QUEUES
        assert store.max_offset(TOPIC, qid) == last.queue_offset, "its queue entry must be cut too"
        for i, res in enumerate(results[:-1]):
            assert index_of(stored_at(store, res.commit_log_offset).body) == i
        assert store.query_by_key(TOPIC, "k39") == []
        check_consistent(store)
        again = store.append(request_for(39))
        assert (again.commit_log_offset, again.queue_offset) == (last.commit_log_offset, last.queue_offset)
    finally:
        store.close()


def test_truncated_segment_file_is_cut(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    results = fill(directory, 30)
    last = results[-1]
    path, pos = segment_path(directory, last.commit_log_offset)
    os.truncate(path, pos + last.size // 2)
    for later in sorted((directory / "commitlog").iterdir()):
        if later.name > path.name:
            later.unlink()  # the pre-allocated next segment
    store = make(directory)
    try:
        assert store.recovery.end == last.commit_log_offset and store.read(last.commit_log_offset) is None
        check_consistent(store)
        more = [store.append(request_for(100 + i)) for i in range(40)]  # rolls past the short segment
        assert all(index_of(stored_at(store, r.commit_log_offset).body) == 100 + i for i, r in enumerate(more))
    finally:
        store.close()
    store = make(directory)
    try:
        assert index_of(stored_at(store, more[-1].commit_log_offset).body) == 139
        check_consistent(store)
    finally:
        store.close()


def test_torn_write_after_a_crash_is_zeroed_and_queue_entries_cut(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    results = fill(directory, 20)
    end = results[-1].commit_log_offset + results[-1].size
    path, pos = segment_path(directory, end)
    # A torn record: the first half of a real one, written where the next record would go, plus
    # a consume-queue entry pointing at it - what a kill between the two writes could leave.
    whole = path.read_bytes()[segment_path(directory, results[5].commit_log_offset)[1]:][: results[5].size]
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(whole[: len(whole) // 2])
    cq = directory / "consumequeue" / TOPIC / "0" / f"{0:020d}"
    with open(cq, "r+b") as f:
        f.seek(7 * 20)
        f.write(struct.pack(">qiq", end, results[5].size, 0))
    (directory / "abort").write_text("crashed")
    store = make(directory)
    try:
        assert store.recovery.crashed and store.recovery.end == end
        assert store.recovery.cut_bytes > 0
        assert store.max_offset(TOPIC, 0) == 7 and store.read(end) is None
        check_consistent(store)
    finally:
        store.close()
    assert path.read_bytes()[pos:].strip(b"\0") == b"", "the torn bytes must be zeroed"


def test_corrupt_record_before_the_tail_is_never_returned(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    results = fill(directory, 60)
    victim = results[3]  # in the first segment, which a clean restart does not re-read
    path, pos = segment_path(directory, victim.commit_log_offset)
    flip(path, pos + HEADER_SIZE + 9)
    store = make(directory)
    try:
        assert store.read(victim.commit_log_offset) is None
        assert store.query_by_id(victim.msg_id) is None
        assert [index_of(stored_at(store, r.commit_log_offset).body) for r in results[4:]] == list(range(4, 60))
    finally:
        store.close()


def test_torn_checkpoint_means_full_check_and_rebuild(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    results = fill(directory, 50)
    with open(directory / "checkpoint", "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff\xff")
    store = make(directory)
    try:
        report = store.recovery
        assert not report.checkpoint_valid and report.checked_from == 0
        assert report.consume_queue_from == 0 and report.redispatched == 50
        assert [index_of(stored_at(store, r.commit_log_offset).body) for r in results] == list(range(50))
        check_consistent(store)
    finally:
        store.close()


# -- the conformance suite's corrupted-tail clause, with store_mmap's own damage hook ----------


def corrupt_mmap_tail(data_dir: Path) -> None:
    """Flip a body byte of the newest record of a closed store_mmap store under ``data_dir``
    (walking the commit log in its own format to find that record)."""
    newest: tuple[Path, int, int] | None = None
    for seg in sorted((data_dir / "store_mmap" / "commitlog").iterdir()):
        raw = seg.read_bytes()
        pos = 0
        while pos + 8 <= len(raw):
            total, magic = struct.unpack_from(">iI", raw, pos)
            if magic != MESSAGE_MAGIC or decode(raw, pos, len(raw) - 8 - pos, int(seg.name) + pos) is None:
                break
            newest = (seg, pos, total)
            pos += total
    assert newest is not None, "no record to damage"
    path, pos, total = newest
    flip(path, pos + total - 3)  # inside the properties, covered by the record CRC


def test_conformance_corrupted_tail_clause(tmp_path: Path) -> None:
    sut = StoreUnderTest("store_mmap", {"flush": "sync", **SMALL}, corrupt_tail=corrupt_mmap_tail)
    opener = Opener(sut, tmp_path / "data", ManualClock())
    try:
        StoreConformance().test_corrupted_tail_never_returned(opener)
    finally:
        opener.close_all()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
