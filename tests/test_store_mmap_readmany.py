"""store_mmap's bulk read (BulkReading): ``read_many`` equals ``read`` record for record.

The compiled ``read_records`` (``_scan.c``) and its Python twin must answer alike on sound records,
on offsets that are no record boundary, past the log's end, below its start and in cut segments,
and on records damaged in any byte, with their CRCs resealed or not (so the structural checks are
reached, not only the CRCs); the Python twin is ``read`` itself, record by record.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, ConsumeQueueEntry, ManualClock, Prop, StoredMessage
from plugmq.core.contracts import BulkReading, read_entries
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.layout import CQ_ENTRY
from plugmq.plugins.store_mmap.record import BORN_HOST_PROPERTY, HEADER_SIZE, decode
from plugmq.plugins.store_mmap.scan import (
    STORED_FIELDS,
    STORED_SETTERS,
    STORED_TYPE,
    PyScanKernel,
    compiled_scan_kernel,
    entry_reader,
)
from tests.helpers.mmap_workload import HOST, SMALL, run, workload

KERNELS = ("c", "python")


def make(path: Path, scan_kernel: str = "auto") -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, "scan_kernel": scan_kernel, "preallocate_next_segment": False})
    return MmapMessageStore(path, options, clock=ManualClock(1_700_000_000.0), store_host=HOST)


def entries_at(offsets: list[int]) -> list[ConsumeQueueEntry]:
    return [ConsumeQueueEntry(i, offset, HEADER_SIZE, 0) for i, offset in enumerate(offsets)]


def test_stored_fields_are_all_of_them() -> None:
    assert tuple(a.name for a in attrs.fields(StoredMessage)) == STORED_FIELDS


@pytest.mark.parametrize("kernel", KERNELS)
def test_read_many_equals_read(tmp_path: Path, kernel: str) -> None:
    """Segment roll-overs, three topics, non-IPv4 born hosts, unicode properties; offsets in
    any order, repeated, inside records, negative, at and past the end."""
    store = make(tmp_path / "s", kernel)
    try:
        results = run(store, workload(11, 400), random.Random(5))
        store.append(AppendRequest("TopicA", 0, b"v6", properties={Prop.KEYS: "k"}, born_host="[::1]:80"))
        assert isinstance(store, BulkReading)
        wrote = store.commit_log.wrote
        offsets = [r.commit_log_offset for r in results] + [-5, 0, 1, 17, wrote, wrote + 1, 1 << 40]
        offsets += [r.commit_log_offset + 3 for r in results[:20]] + [results[7].commit_log_offset] * 3
        random.Random(2).shuffle(offsets)
        one_by_one = [store.read(offset) for offset in offsets]
        assert sum(m is not None for m in one_by_one) >= len(results) + 1
        assert store.read_many(entries_at(offsets)) == one_by_one
        assert read_entries(store, entries_at(offsets)) == one_by_one
        assert store.read_many([]) == []
        born = store.read_many(entries_at([store.commit_log.wrote - 1]))  # not a boundary
        assert born == [None]
    finally:
        store.close()
    assert store.read_many(entries_at([0])) == [None]  # closed: as read


def test_read_many_after_retention_and_a_cut_tail(tmp_path: Path) -> None:
    """Records of a segment retention took and records a reopened store cut read as None."""
    store = make(tmp_path / "s")
    try:
        results = run(store, workload(3, 300), random.Random(1))
        offsets = [r.commit_log_offset for r in results]
        oldest = store.commit_log.segments[0]
        store.commit_log.detach_first(oldest)
        oldest.destroy()
        found = store.read_many(entries_at(offsets))
        assert found == [store.read(o) for o in offsets]
        assert found[0] is None and found[-1] is not None
    finally:
        store.close()
    newest = sorted((tmp_path / "s" / "commitlog").iterdir())[-1]
    cut_at = offsets[-3] - int(newest.name)
    with open(newest, "r+b") as f:  # the last three records torn away
        f.seek(cut_at)
        f.write(bytes(results[-1].commit_log_offset + 200 - offsets[-3]))
    store = make(tmp_path / "s")
    try:
        found = store.read_many(entries_at(offsets))
        assert found == [store.read(o) for o in offsets]
        assert found[-4] is not None and found[-3:] == [None] * 3
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------
# the two kernels on damaged bytes
# ------------------------------------------------------------------------------------------------

_CRC = struct.Struct(">I")


def reseal(buf: bytearray, pos: int) -> None:
    """Recompute the CRCs of the record at ``pos`` after its bytes changed (if its sizes still
    frame a record), so damage reaches the checks behind the CRCs."""
    total, _magic = struct.unpack_from(">iI", buf, pos)
    body_len = struct.unpack_from(">i", buf, pos + 96)[0]
    if not (HEADER_SIZE <= total <= len(buf) - pos and 0 <= body_len <= total - HEADER_SIZE):
        return
    _CRC.pack_into(buf, pos + 12, zlib.crc32(buf[pos + HEADER_SIZE: pos + HEADER_SIZE + body_len]))
    tail = buf[pos + HEADER_SIZE + body_len: pos + total]
    _CRC.pack_into(buf, pos + 8, zlib.crc32(buf[pos + 12: pos + HEADER_SIZE], zlib.crc32(tail)))


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[int], int]:
    """The first segment of a store (bytes), its record offsets and its readable end."""
    store = make(tmp_path_factory.mktemp("seg") / "s")
    try:
        rng = random.Random(9)
        requests = workload(4, 60)
        requests.append(AppendRequest("TopicB", 1, b"h", properties={Prop.TAGS: "\u00fc"}, born_host="[::1]:9"))
        results = run(store, requests, rng)
        seg = store.commit_log.segment_for(0)
        assert seg is not None
        offsets = [r.commit_log_offset for r in results if r.commit_log_offset < seg.end]
        limit = min(seg.size - 8, store.commit_log.wrote)
        return bytes(seg.mm[:limit + 8]), offsets, limit
    finally:
        store.close()


def both(buf: bytearray, offsets: list[int], limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spans = [(0, len(buf), limit, buf)]
    for name, kernel in (("c", compiled_scan_kernel()), ("python", PyScanKernel())):
        try:
            out[name] = kernel.read_records(offsets, spans, STORED_TYPE, STORED_SETTERS, BORN_HOST_PROPERTY)
        except UnicodeDecodeError as exc:
            out[name] = type(exc)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kernels_read_damaged_records_alike(segment: tuple[bytes, list[int], int], data: st.DataObject) -> None:
    raw, offsets, limit = segment
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 4))):
        which = data.draw(st.sampled_from(offsets))
        at = which + data.draw(st.integers(0, 160))
        if at < len(buf):
            buf[at] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xC3, 0xED, 0xFF, buf[at] ^ 1]))
            if data.draw(st.booleans()):
                reseal(buf, which)
    wanted = offsets + data.draw(st.lists(st.integers(-2, limit + 16), max_size=8))
    found = both(buf, wanted, data.draw(st.sampled_from([limit, limit // 2, 0])))
    assert found["c"] == found["python"]


def test_invalid_utf8_properties_behind_a_sound_crc(segment: tuple[bytes, list[int], int]) -> None:
    """A record whose CRCs hold but whose properties are not UTF-8 raises as ``read`` does."""
    raw, offsets, limit = segment
    buf = bytearray(raw)
    pos = offsets[0]
    total, body_len = struct.unpack_from(">i", buf, pos)[0], struct.unpack_from(">i", buf, pos + 96)[0]
    props_len = total - HEADER_SIZE - body_len - 3 - buf[pos + HEADER_SIZE + body_len]
    assert props_len > 0
    buf[pos + total - 1] = 0xFF
    reseal(buf, pos)
    assert both(buf, [pos], limit) == {"c": UnicodeDecodeError, "python": UnicodeDecodeError}


def test_born_host_in_properties(segment: tuple[bytes, list[int], int]) -> None:
    raw, offsets, limit = segment
    found = both(bytearray(raw), offsets, limit)
    assert found["c"] == found["python"]
    assert found["c"][-1].born_host == "[::1]:9" and BORN_HOST_PROPERTY not in found["c"][-1].properties
    assert all(isinstance(m, StoredMessage) for m in found["c"])


def queue_runs(raw: bytes, offsets: list[int], limit: int) -> list[tuple[bytes, int, int, bytes]]:
    """Per queue of the segment's records: (its 20-byte consume-queue entries, first queue offset,
    queue id, topic), as the store's consume queue holds them."""
    queues: dict[tuple[str, int], list[Any]] = {}
    for offset in offsets:
        rec = decode(raw, offset, limit - offset, offset)
        assert rec is not None
        queues.setdefault((rec.topic, rec.queue_id), []).append(rec)
    runs = []
    for (topic, queue_id), recs in sorted(queues.items()):
        assert [r.queue_offset for r in recs] == list(range(recs[0].queue_offset, recs[0].queue_offset + len(recs)))
        runs.append((b"".join(CQ_ENTRY.pack(r.phys, r.total, r.tags_code) for r in recs), recs[0].queue_offset,
                     queue_id, topic.encode()))
    return runs


def runs_both(buf: bytes | bytearray, limit: int, entries: bytes, first: int, queue_id: int,
              topic: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spans = [(0, len(buf), limit, buf)]
    for name, kernel in (("c", compiled_scan_kernel()), ("python", PyScanKernel())):
        try:
            out[name] = kernel.read_run(entries, first, queue_id, topic, spans, STORED_TYPE, STORED_SETTERS,
                                        BORN_HOST_PROPERTY)
        except (UnicodeDecodeError, ValueError) as exc:
            out[name] = type(exc)
    return out


def test_read_run_reads_a_queues_run_as_read_records(segment: tuple[bytes, list[int], int]) -> None:
    """Sound entries: the run is read_records of their offsets, from either kernel; a partial
    trailing entry is ignored and no entries read nothing."""
    raw, offsets, limit = segment
    runs = queue_runs(raw, offsets, limit)
    assert len(runs) >= 6
    for entries, first, queue_id, topic in runs:
        phys = [CQ_ENTRY.unpack_from(entries, i)[0] for i in range(0, len(entries), CQ_ENTRY.size)]
        expected = PyScanKernel().read_records(phys, [(0, len(raw), limit, raw)], STORED_TYPE, STORED_SETTERS,
                                               BORN_HOST_PROPERTY)
        assert runs_both(raw, limit, entries, first, queue_id, topic) == {"c": expected, "python": expected}
        assert runs_both(raw, limit, entries + b"\0" * 7, first, queue_id, topic)["c"] == expected
        assert runs_both(raw, limit, b"", first, queue_id, topic) == {"c": [], "python": []}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kernels_read_runs_alike(segment: tuple[bytes, list[int], int], data: st.DataObject) -> None:
    """Damaged records (resealed or not), damaged entries, a run handed another queue offset,
    queue id or topic: both kernels answer alike (a run that is not exact is None)."""
    raw, offsets, limit = segment
    entries, first, queue_id, topic = data.draw(st.sampled_from(queue_runs(raw, offsets, limit)))
    buf, cut = bytearray(raw), bytearray(entries)
    for _ in range(data.draw(st.integers(0, 3))):
        which = data.draw(st.sampled_from(offsets))
        at = which + data.draw(st.integers(0, 160))
        if at < len(buf):
            buf[at] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xC3, 0xFF, buf[at] ^ 1]))
            if data.draw(st.booleans()):
                reseal(buf, which)
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(cut) - 1))
        cut[at] = data.draw(st.sampled_from([0x00, 0xFF, cut[at] ^ 1, cut[at] ^ 0x80]))
    first += data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    queue_id += data.draw(st.sampled_from([0, 0, 0, 1]))
    topic = data.draw(st.sampled_from([topic, topic, topic + b"x", topic[:-1]]))
    found = runs_both(buf, data.draw(st.sampled_from([limit, limit // 2])), bytes(cut), first, queue_id, topic)
    assert found["c"] == found["python"]


class _Delegate:
    """A data descriptor that is no slot: the compiled kernel must call it, not write at an offset."""

    def __init__(self, slot: Any) -> None:
        self.slot = slot
        self.calls = 0

    def __set__(self, obj: object, value: object) -> None:
        self.calls += 1
        self.slot.__set__(obj, value)


def test_slots_are_set_through_setters_that_are_not_the_types_slots(segment: tuple[bytes, list[int], int]) -> None:
    """The kernel writes a slot straight at its offset only when every setter is a writable
    object slot of the type it builds; otherwise it calls the setters (and their errors count)."""
    raw, offsets, limit = segment
    spans = [(0, len(raw), limit, raw)]
    kernel = compiled_scan_kernel()
    direct = kernel.read_records(offsets, spans, STORED_TYPE, STORED_SETTERS, BORN_HOST_PROPERTY)
    delegates = tuple(_Delegate(slot) for slot in STORED_SETTERS)
    assert kernel.read_records(offsets, spans, STORED_TYPE, delegates, BORN_HOST_PROPERTY) == direct
    assert all(d.calls == len(offsets) for d in delegates)
    foreign = (*STORED_SETTERS[:4], ConsumeQueueEntry.queue_offset, *STORED_SETTERS[5:])  # not StoredMessage's
    with pytest.raises(TypeError):
        kernel.read_records(offsets, spans, STORED_TYPE, foreign, BORN_HOST_PROPERTY)
    with pytest.raises(ValueError, match="16 slot descriptors"):
        kernel.read_records(offsets, spans, STORED_TYPE, STORED_SETTERS[:15], BORN_HOST_PROPERTY)


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=20 * 9 + 7), first=st.integers(0, 1 << 40))
def test_kernels_build_queue_entries_alike(raw: bytes, first: int) -> None:
    """``read_queue``'s entries: any 20-byte entries (a trailing partial one ignored) from any
    queue offset, equal to unpacking them one by one."""
    unpacked = [ConsumeQueueEntry(first + i, *struct.unpack_from(">qiq", raw, i * 20)) for i in range(len(raw) // 20)]
    for kernel in (compiled_scan_kernel(), PyScanKernel()):
        assert entry_reader(kernel)(raw, first) == unpacked
