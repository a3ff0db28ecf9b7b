"""The compiled bulk decoder of stored requests (plugmq.kit.requestcodec) against the delay
plugins' Python decoders: the same requests for the formats written now, and the records it does
not take (older formats, damaged bytes) decided by the Python decoder as before."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, Prop
from plugmq.kit import requestcodec
from plugmq.plugins.delay_schedule import records as sched
from plugmq.plugins.delay_wheel import codec as wheel

native = pytest.mark.skipif(not requestcodec.native_available(), reason="plugmq.kit._requestcodec was not built")
DROP = (Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS)

_text = st.text(st.characters(exclude_characters="\x01", exclude_categories=["Cs"]), max_size=12)
requests = st.builds(
    AppendRequest,
    topic=st.sampled_from(["T", "Topic_1", "%RETRY%g"]),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=300),
    properties=st.dictionaries(st.sampled_from(["a", "TAGS", "KEYS", Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS, "ключ"]),
                               _text, max_size=5),
    tags_code=st.integers(-(2**63), 2**63 - 1),
    born_timestamp_ms=st.integers(0, 2**62),
    born_host=st.sampled_from(["127.0.0.1:0", "10.0.0.2:10911"]),
    reconsume_times=st.integers(0, 2**31 - 1),
    sys_flag=st.integers(0, 2**31 - 1),
    prepared_transaction_offset=st.integers(0, 2**62),
)


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both ways through the plugins' bulk functions: the compiled decoder and its Python twin."""
    if request.param == "native" and not requestcodec.native_available():
        pytest.skip("plugmq.kit._requestcodec was not built")
    monkeypatch.setattr(requestcodec, "_native_disabled", request.param == "python")
    yield request.param


def _joined(records: list[bytes]) -> tuple[bytes, list[int], list[int]]:
    positions, at = [], 0
    for record in records:
        positions.append(at)
        at += len(record)
    return b"".join(records), positions, [len(r) for r in records]


# ------------------------------------------------------------------------------ delay_wheel


def _wheel_v1(request: AppendRequest, deliver_at: int, scheduled_at: int, level: int | None) -> bytes:
    """A record as delay_wheel wrote it before version 2: the text fields as a JSON array."""
    text = json.dumps([request.topic, request.born_host, dict(request.properties)]).encode()
    payload = wheel._FIXED.pack(deliver_at, scheduled_at, -1 if level is None else level, request.queue_id,
                                request.tags_code, request.born_timestamp_ms, request.reconsume_times,
                                request.sys_flag, request.prepared_transaction_offset, len(text)) + text + request.body
    return struct.pack("<III", wheel.RECORD_MAGIC_V1, len(payload), zlib.crc32(payload)) + payload


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(requests, st.integers(0, 2**50), st.one_of(st.none(), st.integers(1, 18)), st.booleans()),
                min_size=1, max_size=8))
def test_wheel_bulk_equals_record_by_record(rows: list[tuple[AppendRequest, int, int | None, bool]]) -> None:
    records = [(_wheel_v1 if old else wheel.encode_record)(r, due, due - 5, level) for r, due, level, old in rows]
    buf, positions, sizes = _joined(records)
    expected = [wheel.decode_record_at(buf, p, s) for p, s in zip(positions, sizes, strict=True)]
    for disabled in (False, True):
        requestcodec._native_disabled = disabled
        try:
            assert wheel.decode_records_at(buf, positions, sizes) == expected
        finally:
            requestcodec._native_disabled = False
    for (request, _, _, _), stored in zip(rows, expected, strict=True):
        assert stored is not None
        assert stored.request.body == request.body
        assert not set(DROP) & set(stored.request.properties)


def test_wheel_damaged_record_is_none_and_its_neighbours_decode(path: str) -> None:
    request = AppendRequest("T", 1, b"x" * 40, {"TAGS": "a", Prop.DELIVER_AT_MS: "5"})
    records = [bytearray(wheel.encode_record(request, 10 + i, 1, None)) for i in range(4)]
    records[1][-3] ^= 0xFF  # body byte: CRC fails
    records[2][0] ^= 0x01  # magic
    buf, positions, sizes = _joined([bytes(r) for r in records])
    sizes[3] += 1  # runs past the buffer's end
    out = wheel.decode_records_at(buf, positions, sizes)
    assert out[0] is not None and out[0].deliver_at_ms == 10 and out[0].request.properties == {"TAGS": "a"}
    assert out[1:] == [None, None, None]


def test_wheel_odd_text_fields_are_refused_by_both(path: str) -> None:
    request = AppendRequest("T", 0, b"body", {"k": "v"})
    record = bytearray(wheel.encode_record(request, 10, 1, None))
    text_at = wheel.RECORD_HEADER_SIZE + wheel._FIXED.size
    record[text_at:text_at + 1] = b"\x01"  # "T" becomes a separator: three text fields
    payload = bytes(record[wheel.RECORD_HEADER_SIZE:])
    record[8:12] = struct.pack("<I", zlib.crc32(payload))
    assert wheel.decode_records_at(bytes(record), [0], [len(record)]) == [None]


# ------------------------------------------------------------------------------ delay_schedule


def _schedule_v1_payload(request: AppendRequest) -> bytes:
    """A request payload as delay_schedule wrote it before version 2: length-prefixed fields."""
    def text(width: str, value: str) -> bytes:
        raw = value.encode()
        return struct.pack(width, len(raw)) + raw

    parts = [sched._REQ_FIXED.pack(request.queue_id, request.tags_code, request.born_timestamp_ms,
                                   request.reconsume_times, request.sys_flag, request.prepared_transaction_offset),
             text(">H", request.topic), text(">H", request.born_host), struct.pack(">I", len(request.properties))]
    for key, value in request.properties.items():
        parts += (text(">I", key), text(">I", value))
    parts.append(struct.pack(">I", len(request.body)) + request.body)
    return b"".join(parts)


def _schedule_record(payload: bytes, seq: int) -> bytes:
    source = sched.MessageLogRecord(seq * 100, 0, seq, 1000 + seq, -1, 1, payload)
    return sched.encode_schedule_record(source, index=seq, store_ts_ms=1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(requests, st.booleans()), min_size=1, max_size=8))
def test_schedule_bulk_equals_record_by_record(rows: list[tuple[AppendRequest, bool]]) -> None:
    records = [_schedule_record(_schedule_v1_payload(r) if old else sched.encode_request(r), i)
               for i, (r, old) in enumerate(rows)]
    buf, positions, sizes = _joined(records)
    expected = [sched.decode_due_request(buf, p, s, DROP) for p, s in zip(positions, sizes, strict=True)]
    for disabled in (False, True):
        requestcodec._native_disabled = disabled
        try:
            assert sched.decode_due_requests(buf, positions, sizes, DROP) == expected
        finally:
            requestcodec._native_disabled = False
    assert None not in expected


def test_schedule_damaged_record_is_none_and_its_neighbours_decode(path: str) -> None:
    request = AppendRequest("T", 1, b"y" * 40, {"TAGS": "a", Prop.DELAY_LEVEL: "3"})
    records = [bytearray(_schedule_record(sched.encode_request(request), i)) for i in range(4)]
    records[1][-12] ^= 0xFF  # body byte: CRC fails
    records[2][-1] ^= 0x01  # trailer magic
    records[3][4:8] = struct.pack(">I", len(records[3]) + 1)  # length field
    buf, positions, sizes = _joined([bytes(r) for r in records])
    out = sched.decode_due_requests(buf, positions, sizes, DROP)
    assert out[0] is not None and out[0].properties == {"TAGS": "a"} and out[0].body == b"y" * 40
    assert out[1:] == [None, None, None]


@native
def test_layout_mistakes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        requestcodec.decode_requests(wheel._LAYOUT, b"", [0, 1], [1])
    bad = (*wheel._LAYOUT.packed()[:-1], ((12, 3),))
    with pytest.raises(ValueError, match="width must be 4 or 8"):
        requestcodec._native.decode(b"", [], [], bad, (), AppendRequest, requestcodec._SETTERS)


def test_schedule_segment_scan_stops_where_the_python_scan_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """delay_schedule's compiled segment scan (_segscan) and its Python loop: the same rows, and
    both stop at a damaged record or at an index out of sequence."""
    from plugmq.plugins.delay_schedule import schedule_log

    request = AppendRequest("T", 1, b"z" * 30, {"TAGS": "a"})
    records = [_schedule_record(sched.encode_request(request), i) for i in range(5)]
    damaged = bytearray(records[3])
    damaged[-12] ^= 0xFF
    cases = {
        "whole": b"".join(records),
        "damaged": b"".join([*records[:3], bytes(damaged), records[4]]),
        "out of sequence": b"".join([records[0], records[2]]),
        "torn": b"".join(records)[:-5],
    }
    results = {}
    for compiled in (True, False):
        if compiled and schedule_log._segscan is None:
            continue
        if not compiled:
            monkeypatch.setattr(schedule_log, "_segscan", None)
        results[compiled] = {name: schedule_log._scan_chunk(data, 0, 1000) for name, data in cases.items()}
    python = results[False]
    assert python["whole"][0] == sum(len(r) for r in records) and len(python["whole"][1]) == 5 * 8
    assert python["whole"][1][:8] == [1000, len(records[0]), 0, 1000, 0, 0, -1, 1]
    assert len(python["damaged"][1]) == 3 * 8 and len(python["out of sequence"][1]) == 8
    assert len(python["torn"][1]) == 4 * 8
    if True in results:
        assert results[True] == python


@given(st.sampled_from([ord("I"), ord("D"), ord("C")]), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_dispatch_records_compiled_equal_python(kind: int, seqs: list[int]) -> None:
    from plugmq.plugins.delay_schedule import dispatch_log

    assert dispatch_log.encode_dispatch(kind, seqs) == dispatch_log.encode_dispatch_python(kind, seqs)
    assert dispatch_log.encode_dispatch(kind, iter(seqs)) == dispatch_log.encode_dispatch_python(kind, seqs)
