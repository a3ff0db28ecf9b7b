"""store_mmap: round trips, segment files, consume-queue rebuild, index files, queries, refusals."""

from __future__ import annotations

import itertools
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plugmq.plugins.store_mmap as plugin
from plugmq.core import (
    AppendRequest,
    AppendStatus,
    ConfigError,
    Family,
    ManualClock,
    MessageStore,
    PluginContext,
    Prop,
    StoreError,
    ValidationError,
    encode_msg_id,
)
from plugmq.core.errors import MessageTooLargeError
from plugmq.core.hashing import java_string_hash
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.keyhash import index_key_hashes, java_hashes
from plugmq.plugins.store_mmap.record import BLANK, BLANK_MAGIC, MESSAGE_MAGIC, decode
from plugmq.testing import wait_for
from tests.helpers.stores import stored_at

HOST = "10.0.0.7:10911"
SEG = 64 * 1024
SMALL: dict[str, Any] = {"commit_log_segment_size": SEG, "consume_queue_entries_per_file": 16, "index_slot_count": 64, "index_max_entries": 40}


def make(path: Path, clock: ManualClock | None = None, **opts: Any) -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, **opts})
    return MmapMessageStore(path, options, clock=clock or ManualClock(), store_host=HOST)


def req(topic: str = "T", qid: int = 0, body: bytes = b"b", **props: str) -> AppendRequest:
    return AppendRequest(topic=topic, queue_id=qid, body=body, properties=props)


@pytest.fixture
def store(tmp_path: Path):
    s = make(tmp_path / "s")
    yield s
    s.close()


# -- plugin wiring ----------------------------------------------------------------------------


def test_declaration_and_factory(tmp_path: Path) -> None:
    decl = plugin.plugmq_declare()
    assert decl.name == "store_mmap" and decl.families == {Family.STORAGE}
    assert decl.options is MmapStoreOptions and decl.capabilities.sync_flush
    ctx = PluginContext("b", tmp_path, ManualClock(), store_host=HOST,
                        options={"store_mmap": MmapStoreOptions(**SMALL)})
    s = plugin.plugmq_make_store(ctx)
    assert isinstance(s, MessageStore)
    try:
        assert (tmp_path / "store_mmap" / "commitlog").is_dir()
        res = s.append(req())
        assert res.msg_id == encode_msg_id(HOST, res.commit_log_offset)
    finally:
        s.close()


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="flush"):
        MmapStoreOptions(flush="sometimes")
    with pytest.raises(ConfigError, match="commit_log_segment_size"):
        MmapStoreOptions(commit_log_segment_size=100)
    with pytest.raises(ConfigError, match="delete_when"):
        MmapStoreOptions(delete_when="25")
    with pytest.raises(ConfigError, match="disk_critical_ratio"):
        MmapStoreOptions(disk_critical_ratio=1.5)


def test_one_process_per_directory(tmp_path: Path, store: MmapMessageStore) -> None:
    with pytest.raises(StoreError, match="already open"):
        make(store.dir)


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 1000, 60_000])
def test_round_trip_bodies(store: MmapMessageStore, size: int) -> None:
    body = os.urandom(size)
    r = req(body=body, KEYS="k1 k2", TAGS="TagA", user="\u00e9\u4e2d\U0001f600")
    r = AppendRequest(topic="T", queue_id=3, body=body, properties=r.properties, tags_code=-5,
                      born_timestamp_ms=123, born_host="192.168.1.2:777", reconsume_times=2, sys_flag=4,
                      prepared_transaction_offset=99)
    res = store.append(r)
    got = store.read(res.commit_log_offset)
    assert got is not None and got.body == body and dict(got.properties) == dict(r.properties)
    assert (got.queue_id, got.queue_offset, got.tags_code, got.born_timestamp_ms, got.born_host) == (3, 0, -5, 123,
                                                                                                     "192.168.1.2:777")
    assert (got.reconsume_times, got.sys_flag, got.prepared_transaction_offset) == (2, 4, 99)
    assert got.store_host == HOST and got.size == res.size and got.msg_id == res.msg_id
    assert store.read(res.commit_log_offset, res.size + 1) == got, "the size is only a hint"


def test_non_ipv4_born_host_survives(store: MmapMessageStore) -> None:
    r = AppendRequest(topic="T", queue_id=0, body=b"x", born_host="client-7@host.example:1234")
    got = store.read(store.append(r).commit_log_offset)
    assert got is not None and got.born_host == "client-7@host.example:1234" and dict(got.properties) == {}


def test_read_rejects_offsets_that_are_not_record_starts(store: MmapMessageStore) -> None:
    res = store.append(req(body=b"x" * 500))
    for off in (res.commit_log_offset + 1, res.commit_log_offset + 100, res.commit_log_offset + res.size, -1):
        assert store.read(off) is None
    assert store.query_by_id(encode_msg_id("10.0.0.8:10911", res.commit_log_offset)) is None, "another broker"
    assert store.query_by_id("not hex") is None
    found = store.query_by_id(res.msg_id)
    assert found is not None and found.body == b"x" * 500


# -- segments ---------------------------------------------------------------------------------


def test_segments_roll_over_with_end_of_file_markers(tmp_path: Path) -> None:
    s = make(tmp_path / "s")
    results = [s.append(req(qid=i % 2, body=bytes([i % 251]) * 3000)) for i in range(60)]
    # Only finished segments: the next one may be mid pre-allocation under a ".tmp" name.
    files = sorted(f for f in (tmp_path / "s" / "commitlog").iterdir() if f.name.isdigit())
    names = [f.name for f in files]
    assert names[:3] == [f"{0:020d}", f"{SEG:020d}", f"{2 * SEG:020d}"]
    assert all(f.stat().st_size == SEG for f in files)
    # Every segment but the last ends with a blank marker that fills it exactly.
    for seg_start in (0, SEG):
        last = max((r for r in results if seg_start <= r.commit_log_offset < seg_start + SEG),
                   key=lambda r: r.commit_log_offset)
        end = last.commit_log_offset + last.size
        raw = (tmp_path / "s" / "commitlog" / f"{seg_start:020d}").read_bytes()
        total, magic = BLANK.unpack_from(raw, end - seg_start)
        assert magic == BLANK_MAGIC and total == SEG - (end - seg_start)
        nxt = min(r.commit_log_offset for r in results if r.commit_log_offset >= seg_start + SEG)
        assert nxt == seg_start + SEG, "the record that did not fit starts the next segment"
    for i, r in enumerate(results):
        assert stored_at(s, r.commit_log_offset).body == bytes([i % 251]) * 3000
    s.close()
    s = make(tmp_path / "s")
    assert [e.commit_log_offset for e in s.read_queue("T", 0, 0, 100)] == [r.commit_log_offset for r in results[::2]]
    s.close()


def test_oversize_record_names_sizes_and_writes_nothing(store: MmapMessageStore) -> None:
    first = store.append(req(body=b"first"))
    with pytest.raises(StoreError, match=rf"does not fit a commit-log segment of {SEG} bytes"):
        store.append(req(body=b"x" * SEG))
    with pytest.raises(StoreError):
        store.append_batch([req(body=b"ok"), req(qid=1, body=b"x" * SEG)])
    with pytest.raises(MessageTooLargeError):
        store.append(req(body=b"x" * (4 * 1024 * 1024 + 1)))
    with pytest.raises(ValidationError, match="out of range"):
        store.append(AppendRequest(topic="T", queue_id=0, body=b"x", sys_flag=1 << 40))
    with pytest.raises(ValidationError, match="separators"):
        store.append(req(body=b"x", user="a\x02b"))
    assert store.max_offset("T", 0) == 1 and store.max_offset("T", 1) == 0
    nxt = store.append(req(body=b"next"))
    assert nxt.commit_log_offset == first.commit_log_offset + first.size and nxt.queue_offset == 1


def test_unvalidated_topic_never_becomes_a_path(tmp_path: Path, store: MmapMessageStore) -> None:
    sneaky = req(body=b"x")
    object.__setattr__(sneaky, "topic", "../escape")
    with pytest.raises(ValidationError):
        store.append_batch([req(body=b"good"), sneaky])
    assert store.max_offset("T", 0) == 0
    assert not list(tmp_path.rglob("escape"))


# -- consume queues ---------------------------------------------------------------------------


def test_consume_queue_files_and_rebuild_after_loss(tmp_path: Path) -> None:
    s = make(tmp_path / "s")
    written = [s.append(req(topic=f"T{i % 2}", qid=i % 3, body=os.urandom(i * 7), TAGS="x"))
               for i in range(120)]
    before = {(t, q): s.read_queue(t, q, 0, 1000) for t in ("T0", "T1") for q in range(3)}
    s.close()
    cq_dir = tmp_path / "s" / "consumequeue" / "T0" / "0"
    # 20 entries in T0/0 with 16 entries per file: two files named by byte offset.
    assert sorted(p.name for p in cq_dir.iterdir()) == [f"{0:020d}", f"{16 * 20:020d}"]
    shutil.rmtree(tmp_path / "s" / "consumequeue")
    s = make(tmp_path / "s")
    assert s.recovery.consume_queue_from == 0 and s.recovery.redispatched == 120
    after = {(t, q): s.read_queue(t, q, 0, 1000) for t in ("T0", "T1") for q in range(3)}
    assert after == before
    assert sum(len(v) for v in after.values()) == len(written)
    res = s.append(req(topic="T0", qid=0))
    assert res.queue_offset == len(before[("T0", 0)])
    s.close()


def test_read_queue_limits(store: MmapMessageStore) -> None:
    for i in range(40):
        store.append(req(qid=1, body=bytes([i])))
    assert [e.queue_offset for e in store.read_queue("T", 1, 14, 5)] == [14, 15, 16, 17, 18]
    assert [e.queue_offset for e in store.read_queue("T", 1, 30, 100)] == list(range(30, 40))
    assert store.read_queue("T", 1, 40, 5) == [] and store.read_queue("T", 1, 0, 0) == []
    assert store.read_queue("T", 9, 0, 5) == [] and store.read_queue("../x", 0, 0, 5) == []
    assert dict(store.queues()) == {"T": 2}


# -- index ------------------------------------------------------------------------------------


def test_query_by_key_across_several_index_files(tmp_path: Path) -> None:
    clock = ManualClock()
    s = make(tmp_path / "s", clock, index_max_entries=10, index_batch=3)
    stamps = []
    for i in range(30):
        s.append(req(body=f"m{i}".encode(), KEYS=f"every k{i % 5}", UNIQ_CLIENT_MESSAGE_ID_KEYIDX=f"U{i:04d}"))
        stamps.append(clock.now_ms())
        clock.advance(2)
    s.append(req(topic="Other", KEYS="every"))
    assert len(list((tmp_path / "s" / "index").iterdir())) >= 9, "3 entries/message, 9 per file"
    assert [m.body for m in s.query_by_key("T", "k3")] == [f"m{i}".encode() for i in range(3, 30, 5)]
    assert [m.body for m in s.query_by_key("T", "U0017")] == [b"m17"]
    assert len(s.query_by_key("T", "every", max_results=100)) == 30
    newest = s.query_by_key("T", "every", max_results=4)
    assert [m.body for m in newest] == [b"m26", b"m27", b"m28", b"m29"], "max_results keeps the newest"
    ranged = s.query_by_key("T", "every", begin_ms=stamps[10], end_ms=stamps[12], max_results=100)
    assert [m.body for m in ranged] == [b"m10", b"m11", b"m12"]
    assert s.query_by_key("T", "nope") == [] and s.query_by_key("Other", "every")[0].topic == "Other"
    s.close()
    s = make(tmp_path / "s", clock, index_max_entries=10)
    assert [m.body for m in s.query_by_key("T", "k4")] == [f"m{i}".encode() for i in range(4, 30, 5)]
    s.close()


def test_index_hash_collisions_are_filtered(tmp_path: Path) -> None:
    # "Aa" and "BB" share a Java hash code, so do "T#Aa" and "T#BB"; one slot forces every key
    # into the same chain as well.
    assert java_string_hash("T#Aa") == java_string_hash("T#BB")
    s = make(tmp_path / "s", index_slot_count=1)
    s.append(req(body=b"aa", KEYS="Aa"))
    s.append(req(body=b"bb", KEYS="BB"))
    s.append(req(topic="U", body=b"other topic", KEYS="Aa"))
    assert [m.body for m in s.query_by_key("T", "Aa")] == [b"aa"]
    assert [m.body for m in s.query_by_key("T", "BB")] == [b"bb"]
    assert [m.body for m in s.query_by_key("U", "Aa")] == [b"other topic"]
    s.close()


def test_index_rebuilt_when_its_directory_is_lost(tmp_path: Path) -> None:
    s = make(tmp_path / "s")
    for i in range(50):
        s.append(req(body=bytes([i]), KEYS=f"key{i % 7}"))
    s.close()
    shutil.rmtree(tmp_path / "s" / "index")
    s = make(tmp_path / "s")
    assert s.recovery.index_from == 0
    assert [m.body for m in s.query_by_key("T", "key3")] == [bytes([i]) for i in range(3, 50, 7)]
    s.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=20))
def test_vectorised_java_hash_matches_core(texts: list[str]) -> None:
    assert [int(h) for h in java_hashes(texts)] == [java_string_hash(t) for t in texts]
    assert all(0 <= int(h) <= 0x7FFFFFFF for h in index_key_hashes(texts))


# -- time -------------------------------------------------------------------------------------


def test_offset_for_timestamp_binary_search(tmp_path: Path) -> None:
    clock = ManualClock()
    s = make(tmp_path / "s", clock)
    start = clock.now_ms()
    for i in range(100):
        s.append(req(qid=2, body=bytes([i])))
        if i % 3 == 2:
            clock.advance(1)
    # Three messages per second: second n starts at offset 3n.
    for second in (0, 1, 17, 33):
        assert s.offset_for_timestamp("T", 2, start + second * 1000) == 3 * second
        assert s.offset_for_timestamp("T", 2, start + second * 1000 + 1) == min(100, 3 * second + 3)
    assert s.offset_for_timestamp("T", 2, start - 1) == 0
    assert s.offset_for_timestamp("T", 2, start + 10**9) == 100
    assert s.offset_for_timestamp("T", 0, start) == 0
    s.close()


def test_store_timestamps_never_go_back(tmp_path: Path) -> None:
    class Jumpy(ManualClock):
        def now_ms(self) -> int:
            self.calls = getattr(self, "calls", 0) + 1
            return super().now_ms() - (5000 if self.calls % 2 == 0 else 0)

    s = make(tmp_path / "s", Jumpy())
    stamps = [s.append(req()).store_timestamp_ms for _ in range(6)]
    assert stamps == sorted(stamps)
    s.close()


# -- record format ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=300), key=st.text(min_size=1, max_size=10).filter(lambda k: not any(
    c.isspace() or c in "\x01\x02" for c in k)), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_is_detected(tmp_path_factory: pytest.TempPathFactory, body: bytes, key: str,
                                     where: float, bit: int) -> None:
    path = tmp_path_factory.mktemp("flip")
    s = make(path)
    try:
        res = s.append(req(body=body, KEYS=key, UNIQ_CLIENT_MESSAGE_ID_KEYIDX="u1"))
        seg = s.commit_log.segment_for(res.commit_log_offset)
        assert seg is not None
        raw = bytearray(seg.mm[: res.size + 8])
    finally:
        s.close()
    assert struct.unpack_from(">I", raw, 4)[0] == MESSAGE_MAGIC
    good = decode(raw, 0, len(raw) - 8, res.commit_log_offset)
    assert good is not None and good.body == body
    pos = int(where * res.size)
    raw[pos] ^= 1 << bit
    assert decode(raw, 0, len(raw) - 8, res.commit_log_offset) is None, f"flip at byte {pos} went unnoticed"


def test_append_batch_is_contiguous_and_in_order(store: MmapMessageStore) -> None:
    results = store.append_batch([req(qid=i % 2, body=bytes([i])) for i in range(9)])
    assert [r.status for r in results] == [AppendStatus.PUT_OK] * 9
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    for a, b in itertools.pairwise(results):
        assert b.commit_log_offset == a.commit_log_offset + a.size
    stats = store.stats()
    assert stats["messages_appended"] == 9 and stats["bytes_appended"] == sum(r.size for r in results)


def test_properties_use_rocketmq_serialisation(store: MmapMessageStore) -> None:
    res = store.append(req(body=b"", KEYS="a b", TAGS="t"))
    seg = store.commit_log.segment_for(res.commit_log_offset)
    assert seg is not None
    raw = bytes(seg.mm[res.commit_log_offset: res.commit_log_offset + res.size])
    assert raw.endswith(b"KEYS\x01a b\x02TAGS\x01t\x02")
    assert Prop.KEYS == "KEYS"


def test_next_segment_is_created_ahead_in_the_background(tmp_path: Path) -> None:
    s = make(tmp_path / "s", warm_segments=True)
    try:
        first = tmp_path / "s" / "commitlog" / f"{0:020d}"
        assert os.stat(first).st_blocks * 512 >= SEG, "warm segments have their blocks reserved"
        ahead = tmp_path / "s" / "commitlog" / f"{SEG:020d}"
        wait_for(ahead.exists, 30, "the next segment pre-allocated by the allocator thread", interval=0.002)
        for i in range(30):
            s.append(req(body=bytes([i]) * 3000))
        assert len(s.commit_log.segments) == 2
        assert s.stats()["segment_allocation_waits"] == 0, "the roll-over found its segment ready"
    finally:
        s.close()
