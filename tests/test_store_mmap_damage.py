"""store_mmap heals by itself: truncated newest segment, bit flips in consume queues, damage in an
old segment. Every skipped or cut record is logged and counted; no intact message is hidden."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
import structlog

from plugmq.broker.broker import Broker
from plugmq.core import ManualClock, Message, MessageQueue
from plugmq.core.message import PullStatus
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.record import HEADER_SIZE
from tests.helpers.stores import stored_at

SEG = 64 * 1024
PER_FILE = 64
SMALL: dict[str, Any] = {"commit_log_segment_size": SEG, "consume_queue_entries_per_file": PER_FILE, "index_slot_count": 97,
         "index_max_entries": 400, "disk_max_used_ratio": 1.0, "disk_force_clean_ratio": 1.0,
         "disk_critical_ratio": 1.0}
TOPIC = "Heal"
QUEUES = 2


def open_broker(path: Path, clock: ManualClock) -> Broker:
    return Broker.open(path, plugins=["store_mmap", "filter_tag"], options={"store_mmap": SMALL}, clock=clock)


def body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (50 + i % 400)


def send(broker: Broker, first: int, n: int) -> list:
    broker.create_topic(TOPIC, QUEUES)
    return [broker.put(Message(TOPIC, body(i), tags=f"t{i % 3}"), i % QUEUES) for i in range(first, first + n)]


def pull_all(broker: Broker, expression: str = "*") -> dict[int, list[int]]:
    """Every message of every queue from offset 0, by queue: the message numbers in order."""
    subscription = broker.compile_subscription("TAG", expression)
    out: dict[int, list[int]] = {}
    for qid in range(QUEUES):
        queue = MessageQueue(TOPIC, broker.name, qid)
        offset, got = 0, []
        while True:
            result = broker.pull(queue, offset, 32, subscription)
            got += [int.from_bytes(m.body[:4], "big") for m in result.messages]
            if result.status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_ILLEGAL) or result.next_begin_offset == offset:
                break
            offset = result.next_begin_offset
        out[qid] = got
    return out


def clo(result: object) -> int:
    """The commit-log offset in a send result's offset message id."""
    return int(result.msg_id[-16:], 16)  # type: ignore[attr-defined]


def expected(n: int, tags: set[int] | None = None) -> dict[int, list[int]]:
    return {q: [i for i in range(n) if i % QUEUES == q and (tags is None or i % 3 in tags)] for q in range(QUEUES)}


def store_dir(path: Path) -> Path:
    return path / "store_mmap"


def mark_crashed(path: Path) -> None:
    (store_dir(path) / "abort").write_text("killed")


# -- a truncated newest segment with its pre-allocated successor -------------------------------


@pytest.mark.parametrize("keep", ["half", "nothing"])
def test_truncated_newest_segment_with_preallocated_successor(tmp_path: Path, keep: str) -> None:
    clock = ManualClock()
    with open_broker(tmp_path, clock) as broker:
        results = send(broker, 0, 120)
        ends = [clo(r) + stored_at(broker.store, clo(r)).size for r in results]
    logdir = store_dir(tmp_path) / "commitlog"
    names = sorted(p.name for p in logdir.iterdir())
    newest = max(clo(r) for r in results) // SEG * SEG
    successor = logdir / f"{newest + SEG:020d}"
    if not successor.exists():  # the background allocator had not got to it: what it would leave
        successor.write_bytes(bytes(SEG))
    victim = logdir / f"{newest:020d}"
    cut_at = ends[-1] - newest - 20 if keep == "half" else 0  # inside the newest record, or all of it
    with open(victim, "r+b") as f:
        f.truncate(cut_at)
    survivors = [i for i, end in enumerate(ends) if end <= newest + cut_at]
    mark_crashed(tmp_path)
    with structlog.testing.capture_logs() as logs, open_broker(tmp_path, clock) as broker:
        report = broker.store.recovery  # type: ignore[attr-defined]
        assert report.regrown_segments == 1 and report.end >= newest
        assert any("truncated commit-log segment" in e["event"] for e in logs)
        got = pull_all(broker)
        numbers = sorted(i for q in got.values() for i in q)
        assert numbers[: len(survivors)] == survivors
        lost = len(results) - len(numbers)
        assert lost > 0 and numbers == list(range(len(numbers))), "only the truncated tail is lost"
        assert report.records_cut == lost, "every message lost with the cut is counted"
        assert any(e["event"] == "messages lost with the cut tail" for e in logs)
        more = send(broker, 1000, 60)  # writes resume and roll over past the regrown segment
    with open_broker(tmp_path, clock) as broker:
        assert not broker.store.recovery.crashed  # type: ignore[attr-defined]
        got = pull_all(broker)
        assert sorted(i for q in got.values() for i in q) == sorted(numbers + list(range(1000, 1060)))
        assert all(broker.store.read(clo(r)) is not None for r in more)
    assert sorted(p.name for p in logdir.iterdir())[: len(names)] != [], "files stay in place"
    print(f"\nFIGURES truncated newest segment ({keep}): segment of {SEG} B cut to {cut_at} B; "
          f"{len(results)} acked, {lost} lost with the cut bytes, {len(numbers)} readable; regrown 1; "
          f"cut_bytes={report.cut_bytes}, records_cut={report.records_cut}")


# -- bit flips in consume queues ----------------------------------------------------------------


def flip_bits(path: Path, rng: random.Random, flips: int, limit: int) -> None:
    data = bytearray(path.read_bytes())
    for _ in range(flips):
        pos = rng.randrange(limit)
        data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def cq_files(path: Path) -> list[Path]:
    return sorted((store_dir(path) / "consumequeue" / TOPIC).rglob("0000*"))


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_bit_flips_in_consume_queues_hide_no_message(tmp_path: Path, stop: str) -> None:
    clock = ManualClock()
    n = 300
    with open_broker(tmp_path, clock) as broker:
        send(broker, 0, n)
    rng = random.Random(15)
    files = cq_files(tmp_path)
    for f in files:
        flip_bits(f, rng, 6, PER_FILE * 20)  # every file, anywhere in its entries
    if stop == "crash":
        mark_crashed(tmp_path)
    with structlog.testing.capture_logs() as logs, open_broker(tmp_path, clock) as broker:
        assert pull_all(broker) == expected(n), "every message, once, in queue order"
        if stop == "crash":
            # Checked at open: even a flipped tag code cannot make the broker-side filter drop one.
            assert broker.store.recovery.queue_entries_checked == n  # type: ignore[attr-defined]
            assert pull_all(broker, "t1") == expected(n, {1})
        stats = broker.store.stats()
        assert stats["records_lost"] == 0
        repaired = stats["queue_entries_repaired"]
        assert repaired > 0
        assert any("consume-queue entries rebuilt" in e["event"] for e in logs)
    print(f"\nFIGURES consume-queue bit flips ({stop} stop): {6 * len(files)} flipped bits in {len(files)} files, "
          f"{n} messages; {repaired:.0f} entries rebuilt from the log, 0 hidden, 0 lost")


# -- damage in an old segment ---------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["clean", "torn_checkpoint"])
def test_damage_in_an_old_segment_is_skipped_and_counted(tmp_path: Path, stop: str) -> None:
    clock = ManualClock()
    with open_broker(tmp_path, clock) as broker:
        results = send(broker, 0, 200)
    victim = results[5]  # first segment: a clean restart does not re-read it
    seg = store_dir(tmp_path) / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as f:
        f.seek(clo(victim) + HEADER_SIZE + 7)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    if stop == "torn_checkpoint":
        with open(store_dir(tmp_path) / "checkpoint", "r+b") as f:
            f.write(b"\xff" * 8)  # recovery then re-reads the whole log, damage included
        mark_crashed(tmp_path)
    with structlog.testing.capture_logs() as logs, open_broker(tmp_path, clock) as broker:
        report = broker.store.recovery  # type: ignore[attr-defined]
        if stop == "torn_checkpoint":
            assert report.damaged_ranges == 1 and report.damaged_bytes > 0 and report.cut_bytes == 0, \
                "damage followed by sound records is skipped, not the end of the log"
        got = pull_all(broker)
        assert sorted(i for q in got.values() for i in q) == [i for i in range(200) if i != 5]
        stats = broker.store.stats()
        assert stats["records_lost"] == 1, "the damaged record is counted, once"
        more = send(broker, 500, 10)
        assert all(broker.store.read(clo(r)) is not None for r in more)
    events = [e["event"] for e in logs]
    assert any("message is lost" in e or "entries rebuilt" in e for e in events)
    if stop == "torn_checkpoint":
        assert any("damaged commit-log records skipped" in e for e in events)
    print(f"\nFIGURES old-segment damage ({stop}): 1 flipped bit in record 5 of 200; damaged ranges "
          f"{report.damaged_ranges} ({report.damaged_bytes} B), records_lost {stats['records_lost']:.0f}, "
          f"199 readable, cut 0")


def test_a_segment_truncated_in_the_middle_keeps_the_records_after_it(tmp_path: Path) -> None:
    """Truncation of an older segment (not the newest): its lost tail is skipped and counted, the
    segments after it stay readable."""
    clock = ManualClock()
    with open_broker(tmp_path, clock) as broker:
        results = send(broker, 0, 200)
    first = store_dir(tmp_path) / "commitlog" / f"{0:020d}"
    with open(first, "r+b") as f:
        f.truncate(SEG // 2)
    in_rest = [i for i, r in enumerate(results) if clo(r) >= SEG]
    with open_broker(tmp_path, clock) as broker:
        report = broker.store.recovery  # type: ignore[attr-defined]
        assert report.regrown_segments == 1 and report.damaged_ranges == 1
        numbers = {i for q in pull_all(broker).values() for i in q}
        assert set(in_rest) <= numbers
        assert broker.store.stats()["records_lost"] == 200 - len(numbers)


def test_store_opened_directly_exposes_repair(tmp_path: Path) -> None:
    """repair_queue is the store's answer to a read miss; a sound entry with a sound record is
    left alone."""
    store = MmapMessageStore(tmp_path, MmapStoreOptions(**SMALL), clock=ManualClock())
    try:
        from plugmq.core import AppendRequest

        store.append(AppendRequest(TOPIC, 0, b"x"))
        assert store.repair_queue(TOPIC, 0, 0) is False
        assert store.stats()["records_lost"] == 0
        entry = store.read_queue(TOPIC, 0, 0, 1)[0]
        cq = store.consume_queues.get(TOPIC, 0)
        assert cq is not None
        struct.pack_into(">q", cq.files[0].mm, 0, entry.commit_log_offset + 4)  # a flipped offset bit
        assert store.read(store.read_queue(TOPIC, 0, 0, 1)[0].commit_log_offset) is None
        assert store.repair_queue(TOPIC, 0, 0) is True
        assert store.read(store.read_queue(TOPIC, 0, 0, 1)[0].commit_log_offset) is not None
    finally:
        store.close()
