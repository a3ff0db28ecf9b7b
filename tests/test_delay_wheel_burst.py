"""delay_wheel's column-wise check of a big second's index chain (HourFiles.chain_rows) against
the walk it stands in for (HourFiles.chain): the same entries, the same error when damaged."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from plugmq.core import AppendRequest, CorruptRecordError
from plugmq.plugins.delay_wheel.codec import INDEX_ENTRY_SIZE, encode_record
from plugmq.plugins.delay_wheel.hourfiles import HourFiles


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


@pytest.mark.parametrize("damage", ["crc", "pointer"])
def test_damaged_chain_raises_as_the_walk_does(files: HourFiles, damage: str) -> None:
    gi = _walk(files, 7)[100][2]
    raw = bytearray(files.idx.read(gi * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE))
    if damage == "crc":
        raw[0] ^= 1
    else:  # an entry moved to another second: second 7 is one short, the walk decides
        raw[24:26] = (3).to_bytes(2, "little")  # its second becomes 3 (and its CRC no longer holds)
    files.idx.write(gi * INDEX_ENTRY_SIZE, bytes(raw))
    with pytest.raises(CorruptRecordError) as walked:
        files.chain(7)
    with pytest.raises(CorruptRecordError) as checked:
        files.chain_rows(7)
    assert str(checked.value) == str(walked.value)


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
