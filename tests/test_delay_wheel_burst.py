"""delay_wheel's column-wise check of a big second's index chain (HourFiles.chain_rows) against
the walk it stands in for (HourFiles.chain): the same entries, the same error when damaged."""

from __future__ import annotations

import random
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, CorruptRecordError
from plugmq.plugins.delay_wheel.codec import INDEX_ENTRY_SIZE, encode_record
from plugmq.plugins.delay_wheel.hourfiles import HourFiles, crc32_rows
from plugmq.plugins.delay_wheel.scheduler import _items_of_columns, _sorted_items


def _walk(files: HourFiles, second: int) -> list[tuple[int, int, int, int, int]]:
    return [(e.ms, e.local_index, e.global_index, e.offset, e.size) for e in files.chain(second)]


@pytest.fixture
def files(tmp_path: Path) -> HourFiles:
    """An hour whose second 7 holds most of 3,000 entries, the others spread over 0..20."""
    files = HourFiles(tmp_path, 5, fsync=False)
    files.map()
    rng = random.Random(1)
    request = AppendRequest("T", 0, b"x", {"k": "v"})
    for i in range(3000):
        files.append(encode_record(request, 1, 0, None), 7 if i % 10 else rng.randint(0, 20), rng.randint(0, 999))
    return files


def test_big_second_equals_the_walk(files: HourFiles) -> None:
    rows = files.chain_rows(7)
    assert len(rows) > 2000 and rows == _walk(files, 7)
    assert [r[1] for r in rows] == list(range(len(rows)))
    for second in (3, 8):  # small seconds take the walk itself
        assert files.chain_rows(second) == _walk(files, second)


def _damage_then_both_raise_alike(files: HourFiles, second: int, gi: int, damage: str = "crc") -> None:
    raw = bytearray(files.idx.read(gi * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE))
    if damage == "crc":
        raw[0] ^= 1
    else:  # an entry moved to another second: this one is one short, the walk decides
        raw[24:26] = (3).to_bytes(2, "little")  # its second becomes 3 (and its CRC no longer holds)
    files.idx.write(gi * INDEX_ENTRY_SIZE, bytes(raw))
    with pytest.raises(CorruptRecordError) as walked:
        files.chain(second)
    with pytest.raises(CorruptRecordError) as checked:
        files.chain_rows(second)
    assert str(checked.value) == str(walked.value)


@pytest.mark.parametrize("damage", ["crc", "pointer"])
def test_damaged_chain_raises_as_the_walk_does(files: HourFiles, damage: str) -> None:
    _damage_then_both_raise_alike(files, 7, _walk(files, 7)[100][2], damage)


def test_lateness_batch_records_what_one_by_one_records() -> None:
    """The shared histogram's vectorised record_many (a burst records a batch at once)."""
    from plugmq.kit.lateness import LatenessHistogram

    rng = random.Random(3)
    values = [rng.randint(-50, 10**9) for _ in range(3000)] + [0, 1, 2, 3, 10**12, -1]
    one, batch = LatenessHistogram(), LatenessHistogram()
    for value in values:
        one.record(value)
    batch.record_many(values[:1000])
    batch.record_many([])
    batch.record_many(iter(values[1000:]))
    assert (batch.count, batch.max_ms) == (one.count, one.max_ms)
    assert [batch.quantile(q) for q in (0.0, 0.5, 0.99, 1.0)] == [one.quantile(q) for q in (0.0, 0.5, 0.99, 1.0)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 2, 500, 999])), min_size=100, max_size=600))
def test_seconds_read_from_their_part_of_the_index_equal_the_walk(tmp_path: Path,
                                                                 entries: list[tuple[int, int]]) -> None:
    """Any interleaving of seconds (a steady stream fills them one after another, a late arrival
    lands far behind its second's first entry): the windowed column check equals the walk, and
    the millisecond level built from its columns equals the one built from the walk's rows."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as directory:
        files = HourFiles(Path(directory), 5, fsync=False)
        files.map()
        request = AppendRequest("T", 0, b"x", {"k": "v"})
        for second, ms in entries:
            files.append(encode_record(request, 1, 0, None), second, ms)
        for second in range(4):
            walked = _walk(files, second)
            assert files.chain_rows(second) == walked
            columns = files.chain_columns(second)
            assert (columns is None) == (len(walked) <= 64)
            if columns is not None:
                assert _items_of_columns(5, second, columns) == _sorted_items(5, second, walked)
        files.close(sync=False)


def test_a_second_at_the_end_of_a_long_index_is_read_and_checked_alone(tmp_path: Path) -> None:
    """A steady stream: each second's entries follow the one before's; damage in the last one is
    found by the windowed check as by the walk."""
    files = HourFiles(tmp_path, 5, fsync=False)
    files.map()
    request = AppendRequest("T", 0, b"x", {"k": "v"})
    for second in range(10):
        for ms in range(200):
            files.append(encode_record(request, 1, 0, None), second, ms * 5)
    files.append(encode_record(request, 1, 0, None), 9, 999)  # ... and one late arrival
    rows = files.chain_rows(9)
    assert rows == _walk(files, 9) and len(rows) == 201 and rows[0][2] == 1800
    _damage_then_both_raise_alike(files, 9, rows[50][2])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.lists(st.binary(min_size=40, max_size=40), min_size=1, max_size=50))
def test_rows_crc_equals_zlib(width: int, rows: list[bytes]) -> None:
    """The column-wise CRC-32 the big-second check uses is zlib's, row by row."""
    import numpy

    table = numpy.frombuffer(b"".join(rows), dtype=numpy.uint8).reshape(len(rows), 40)[:, :width]
    assert crc32_rows(table).tolist() == [zlib.crc32(row[:width]) for row in rows]


class _Crash(BaseException):
    """The process dies right after a batch reached the store (real kills: test_delay_wheel_crash)."""


def test_big_interleaved_seconds_go_out_in_key_order_once_across_a_crash(tmp_path: Path) -> None:
    """Three seconds of 150 messages each, scheduled interleaved at random milliseconds (each is a
    big second: its millisecond level comes from the column check); the process dies after the
    second batch reached the store. Reopened, every message goes out once, in (due ms, send) order."""
    from plugmq.broker.components import open_delay_scheduler
    from plugmq.core import AppendResult, AppendStatus, ManualClock, Prop

    clock = ManualClock(1_700_000_000)
    start = clock.now_ms()
    rng = random.Random(5)
    delivered: list[str] = []
    crash_after = [2]
    batches: list[int] = []

    def deliver(request: AppendRequest) -> AppendResult:
        delivered.append(request.properties[Prop.UNIQ_KEY])
        return AppendResult(AppendStatus.PUT_OK, "0" * 32, len(delivered), 0, 1, 0)

    def deliver_batch(requests: Sequence[AppendRequest]) -> list[AppendResult]:
        results = [deliver(r) for r in requests]
        batches.append(len(requests))
        crash_after[0] -= 1
        if crash_after[0] == 0:
            raise _Crash
        return results

    def was_delivered(request: AppendRequest) -> bool:
        return request.properties[Prop.UNIQ_KEY] in delivered

    def open_wheel(clock: ManualClock) -> Any:
        wheel = open_delay_scheduler("delay_wheel", tmp_path, deliver=deliver, deliver_batch=deliver_batch, clock=clock,
                                     was_delivered=was_delivered, options={"dispatch_batch": 40})
        wheel.start()
        return wheel

    wheel = open_wheel(clock)
    due: dict[str, int] = {}
    for i in range(450):
        at = start + 5000 + 1000 * (i % 3) + rng.choice([0, 1, 7, 500, 999])
        uid = f"m{i:03d}"
        due[uid] = at
        wheel.schedule(AppendRequest("T", 0, b"x", {Prop.UNIQ_KEY: uid}), deliver_at_ms=at, delay_level=None)
    assert wheel.metrics()["scheduled"] == 450
    with pytest.raises(_Crash):
        clock.set((start + 9000) / 1000)
    assert len(batches) == 2 and len(delivered) == sum(batches)
    # The dead process's wheel is dropped unclosed, its timers with its clock; a new one opens
    # the same files at the same time.
    clock = ManualClock(clock.now())
    wheel = open_wheel(clock)
    clock.set((start + 9000) / 1000)
    assert delivered == sorted(due, key=lambda u: (due[u], u))
    assert wheel.metrics()["in_doubt_found_delivered"] == batches[1] and wheel.pending() == 0
    wheel.close()
