"""Random-bytes fuzzing of every entry point of the compiled kernels against its Python twin.

``python -X faulthandler -m tests.helpers.kernel_fuzz TARGET EXAMPLES LAST_INPUT_FILE`` runs one target
with Hypothesis for a fixed example budget in its own process (a crash in C must not take pytest
down: tests/test_kernel_fuzz.py starts this and reports a crash with the last input, which each
example writes to LAST_INPUT_FILE before it calls the kernel). Inputs are valid data (records
written by the Python twins), the same data mutated (bytes flipped, cut, arguments off by a few),
and plain random bytes. The rule: where the C kernel answers, its answer equals the Python twin's;
where one refuses the input with an exception, so does the other; nothing crashes. The last line
on stdout is ``{"target": ..., "examples": n}``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import random
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, ManualClock, Message, Prop
from plugmq.core.errors import StoreFullError, ValidationError
from plugmq.core.message import (
    AppendResult,
    AppendStatus,
    MessageQueue,
    SendResult,
    StoredMessage,
    fill_slots_py,
)
from plugmq.kit import requestcodec
from plugmq.plugins.delay_schedule import dispatch_log, records, schedule_log
from plugmq.plugins.delay_wheel import codec as wheel
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from plugmq.plugins.store_mmap.record import BORN_HOST_PROPERTY
from plugmq.plugins.store_mmap.scan import (
    KEYS_NAME,
    STORED_SETTERS,
    STORED_TYPE,
    UNIQ_NAME,
    PyScanKernel,
    compiled_scan_kernel,
)
from tests.helpers.mmap_workload import files

SMALL = {"commit_log_segment_size": 8192, "consume_queue_entries_per_file": 16, "index_slot_count": 64,
         "index_max_entries": 400, "preallocate_next_segment": False}
_last_input: Path | None = None
# Stores are opened and closed per example: in memory where the machine has a tmpfs (no fsync waits).
_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _note(**inputs: Any) -> None:
    """Keep the example about to run, so a crash can be reported with it."""
    if _last_input is not None:
        _last_input.write_text(repr(inputs)[:20_000], encoding="utf-8")


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value) or ("raised", exception class name)."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the comparison is whether both sides refuse
        return "raised", type(exc).__name__


def _agree(c: tuple[str, Any], py: tuple[str, Any], what: str) -> None:
    """The same answer, or the same kind of refusal."""
    assert c == py, f"{what}: C {c!r} != Python {py!r}"


def _mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, maybe cut short, maybe with random bytes spliced in."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        if buf:
            at = draw(st.integers(0, len(buf) - 1))
            buf[at] ^= draw(st.integers(1, 255))
    if buf and draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf))):]
    if draw(st.integers(0, 5)) == 0:
        at = draw(st.integers(0, len(buf)))
        buf[at:at] = draw(st.binary(max_size=64))
    return bytes(buf)


def _near(draw: st.DrawFn, value: int, spread: int = 16) -> int:
    """``value``, or something a little off, or anything at all."""
    choice = draw(st.integers(0, 5))
    if choice <= 2:
        return value
    if choice <= 4:
        return value + draw(st.integers(-spread, spread))
    return draw(st.integers(-(2**40), 2**40))


# ------------------------------------------------------------------------------ store_mmap data


def _requests(seed: int, count: int) -> list[AppendRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        props = {Prop.TAGS: rng.choice(["TagA", "ü"])}
        if rng.random() < 0.6:
            props[Prop.KEYS] = rng.choice(["k1 k2", "k\u00e9 \U0001f600", "a\u2003b", ""])
        if rng.random() < 0.6:
            props[Prop.UNIQ_KEY] = f"U{seed}-{i}"
        out.append(AppendRequest(rng.choice(["TopicA", "TopicB"]), rng.randrange(3), rng.randbytes(rng.choice([0, 9, 300])),
                                 properties=props, tags_code=rng.randrange(-(2**63), 2**63),
                                 born_host=rng.choice(["10.0.0.1:9", "[::1]:9"])))
    return out


def _open_store(path: Path, kernel: str) -> MmapMessageStore:
    options = MmapStoreOptions(**{**SMALL, "append_kernel": kernel})  # type: ignore[arg-type]
    return MmapMessageStore(path, options, clock=ManualClock(1_700_000_000.0), store_host="10.0.0.7:10911")


class _StoreData:
    """Commit-log segments and consume-queue files of a store the Python kernel wrote."""

    def __init__(self, root: Path) -> None:
        store = _open_store(root, "python")
        for i, request in enumerate(_requests(1, 120)):
            store.append(request) if i % 3 else store.append_batch([request])
        store.close()
        self.segments = [(int(p.name), p.read_bytes()) for p in sorted((root / "commitlog").iterdir())]
        self.queues = [(int(p.parent.name), p.read_bytes()) for p in sorted((root / "consumequeue").glob("*/*/0*"))]
        self.runs = [(p.parent.parent.name.encode(), int(p.parent.name), p.read_bytes())
                     for p in sorted((root / "consumequeue").glob("*/*/0*"))]
        self.log_end = sum(len(data) for _, data in self.segments)


@contextlib.contextmanager
def _store_data() -> Iterator[_StoreData]:
    with tempfile.TemporaryDirectory(dir=_SCRATCH) as tmp:
        yield _StoreData(Path(tmp) / "store")


# ------------------------------------------------------------------------------ targets


def fuzz_scan(examples: int) -> int:
    """store_mmap ``_scan.scan`` vs ``PyScanKernel.scan``."""
    c_kernel, py_kernel = compiled_scan_kernel(), PyScanKernel()
    count = [0]
    with _store_data() as data:
        @st.composite
        def case(draw: st.DrawFn) -> dict[str, Any]:
            if draw(st.integers(0, 4)) == 0:
                buffer, start, size = draw(st.binary(max_size=600)), 0, draw(st.integers(0, 700))
            else:
                start, clean = draw(st.sampled_from(data.segments))
                buffer, size = _mutated(draw, clean), len(clean)
            return {"buffer": buffer, "pos": _near(draw, 0, 400), "readable": _near(draw, len(buffer), 64),
                    "seg_size": _near(draw, size, 16), "seg_start": _near(draw, start, 8),
                    "limit": draw(st.sampled_from([1 << 62, draw(st.integers(-10, 9000))])),
                    "rows": draw(st.booleans()), "keys": draw(st.integers(0, 2)),
                    "topic_ids": draw(st.sampled_from([{}, {b"TopicA": 0}]))}

        @given(case())
        def run(args: dict[str, Any]) -> None:
            count[0] += 1
            args["topic_names"] = [name.decode() for name in args["topic_ids"]]  # numbered as the ids say
            _note(**args)
            outcomes = []
            for kernel in (c_kernel, py_kernel):
                ids, names = copy.deepcopy(args["topic_ids"]), list(args["topic_names"])
                outcome = _outcome(lambda k=kernel, i=ids, n=names: k.scan(  # type: ignore[misc]
                    args["buffer"], args["pos"], args["readable"], args["seg_size"], args["seg_start"], args["limit"],
                    args["rows"], args["keys"], KEYS_NAME, UNIQ_NAME, i, n))
                outcomes.append((outcome, ids, names))
            (c, c_ids, c_names), (py, py_ids, py_names) = outcomes
            _agree(c, py, "scan")
            if c[0] == "ok":
                assert (c_ids, c_names) == (py_ids, py_names), "the topic tables differ"

        _settings(examples)(run)()
    return count[0]


def fuzz_check_entries(examples: int) -> int:
    """store_mmap ``_scan.check_entries`` vs ``PyScanKernel.check_entries``."""
    c_kernel, py_kernel = compiled_scan_kernel(), PyScanKernel()
    count = [0]
    with _store_data() as data:
        @st.composite
        def case(draw: st.DrawFn) -> dict[str, Any]:
            queue_id, entries = draw(st.sampled_from(data.queues))
            if draw(st.integers(0, 4)) == 0:
                entries = draw(st.binary(max_size=200))
            segments = [(start, len(raw), _mutated(draw, raw) if draw(st.integers(0, 3)) == 0 else raw)
                        for start, raw in data.segments if draw(st.integers(0, 6))]
            if draw(st.integers(0, 6)) == 0:
                segments.reverse()
            return {"entries": _mutated(draw, entries), "first_qoff": _near(draw, 0, 4),
                    "queue_id": _near(draw, queue_id, 2) % (2**31), "log_end": _near(draw, data.log_end, 64),
                    "segments": segments}

        @given(case())
        def run(args: dict[str, Any]) -> None:
            count[0] += 1
            _note(**args)
            c, py = (_outcome(lambda k=kernel: k.check_entries(  # type: ignore[misc]
                args["entries"], args["first_qoff"], args["queue_id"], args["log_end"], args["segments"]))
                for kernel in (c_kernel, py_kernel))
            _agree(c, py, "check_entries")

        _settings(examples)(run)()
    return count[0]


def fuzz_read_run(examples: int) -> int:
    """store_mmap ``_scan.read_run`` and ``read_records`` vs ``PyScanKernel``'s (the reads of pulls)."""
    c_kernel, py_kernel = compiled_scan_kernel(), PyScanKernel()
    count = [0]
    with _store_data() as data:
        @st.composite
        def case(draw: st.DrawFn) -> dict[str, Any]:
            topic, queue_id, entries = draw(st.sampled_from(data.runs))
            if draw(st.integers(0, 4)) == 0:
                entries = draw(st.binary(max_size=200))
            segments = [(start, start + len(raw), _near(draw, len(raw) - 8, 64),
                         _mutated(draw, raw) if draw(st.integers(0, 3)) == 0 else raw)
                        for start, raw in data.segments if draw(st.integers(0, 6))]
            if draw(st.integers(0, 6)) == 0:
                segments.reverse()
            return {"entries": _mutated(draw, entries), "first_qoff": _near(draw, 0, 4),
                    "queue_id": _near(draw, queue_id, 2) % (2**31),
                    "topic": draw(st.sampled_from([topic, topic, b"TopicA", b"", topic + b"\xff"])),
                    "segments": segments}

        @given(case())
        def run(args: dict[str, Any]) -> None:
            count[0] += 1
            _note(**args)
            c, py = (_outcome(lambda k=kernel: k.read_run(  # type: ignore[misc]
                args["entries"], args["first_qoff"], args["queue_id"], args["topic"], args["segments"],
                STORED_TYPE, STORED_SETTERS, BORN_HOST_PROPERTY)) for kernel in (c_kernel, py_kernel))
            _agree(c, py, "read_run")
            whole = len(args["entries"]) // 20 * 20
            offsets = [int.from_bytes(args["entries"][i:i + 8], "big", signed=True) for i in range(0, whole, 20)]
            c, py = (_outcome(lambda k=kernel: k.read_records(  # type: ignore[misc]
                offsets, args["segments"], STORED_TYPE, STORED_SETTERS, BORN_HOST_PROPERTY))
                for kernel in (c_kernel, py_kernel))
            _agree(c, py, "read_records")

        _settings(examples)(run)()
    return count[0]


def _schedule_records(draw: st.DrawFn) -> bytes:
    out = []
    for i in range(draw(st.integers(0, 5))):
        payload = draw(st.binary(max_size=80))
        source = records.MessageLogRecord(i * 100, 0, draw(st.integers(-(2**63), 2**63 - 1)),
                                          draw(st.integers(-(2**63), 2**63 - 1)), draw(st.integers(-(2**31), 2**31 - 1)),
                                          1, payload)
        out.append(records.encode_schedule_record(source, index=draw(st.sampled_from([i, i + 1, 2**32 - 1])),
                                                  store_ts_ms=draw(st.integers(-(2**63), 2**63 - 1))))
    return b"".join(out)


def fuzz_segscan(examples: int) -> int:
    """delay_schedule ``_segscan.scan`` vs ``schedule_log.scan_records``."""
    native = schedule_log._segscan
    count = [0]

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        data = draw(st.binary(max_size=300)) if draw(st.integers(0, 4)) == 0 else _mutated(draw, _schedule_records(draw))
        return {"data": data, "pos": _near(draw, 0, 80), "number": _near(draw, 0, 2) % (2**40),
                "base": draw(st.integers(-(2**40), 2**40))}

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**args)
        c = _outcome(lambda: native.scan(args["data"], args["pos"], args["number"], args["base"]))
        py = _outcome(lambda: schedule_log.scan_records(args["data"], args["pos"], args["number"], args["base"]))
        _agree(c, py, "segscan.scan")

    _settings(examples)(run)()
    return count[0]


def fuzz_encode_dispatch(examples: int) -> int:
    """delay_schedule ``_segscan.encode_dispatch`` vs ``dispatch_log.encode_dispatch_python``."""
    native = dispatch_log._segscan
    count = [0]

    @given(st.integers(-3, 300), st.lists(st.integers(-(2**64), 2**64), max_size=20))
    def run(kind: int, seqs: list[int]) -> None:
        count[0] += 1
        _note(kind=kind, seqs=seqs)
        _agree(_outcome(lambda: native.encode_dispatch(kind, seqs)),
               _outcome(lambda: dispatch_log.encode_dispatch_python(kind, seqs)), "encode_dispatch")

    _settings(examples)(run)()
    return count[0]


_TEXT = st.text(st.characters(blacklist_characters="\x01", codec="utf-8"), max_size=10)
_REQUESTS = st.builds(
    AppendRequest, topic=st.sampled_from(["T", "%RETRY%g"]), queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=60),
    properties=st.dictionaries(st.sampled_from(["a", "KEYS", Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS, "ключ"]), _TEXT,
                               max_size=4),
    tags_code=st.integers(-(2**63), 2**63 - 1), born_timestamp_ms=st.integers(0, 2**62),
    reconsume_times=st.integers(0, 2**31 - 1), sys_flag=st.integers(0, 2**31 - 1),
    prepared_transaction_offset=st.integers(0, 2**62))
_DROP = (Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS)


def _python_request(layout: str, buf: bytes, pos: int, size: int) -> Any:
    """What the plugin's Python decoder makes of one record (None: refused)."""
    if layout == "schedule":
        return records.decode_due_request(buf, pos, size, _DROP)
    try:
        stored = wheel.decode_record_at(buf, pos, size)
    except (wheel.CorruptRecordError, ValueError):
        return None
    return stored.request, (stored.deliver_at_ms, stored.scheduled_at_ms,
                            -1 if stored.delay_level is None else stored.delay_level)


def fuzz_requestcodec(examples: int) -> int:
    """kit ``_requestcodec.decode`` vs the delay plugins' record-by-record Python decoders."""
    native = requestcodec._native
    layouts = {"schedule": records._LAYOUT, "wheel": wheel._LAYOUT}
    count = [0]

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        layout = draw(st.sampled_from(sorted(layouts)))
        recs = []
        for i, request in enumerate(draw(st.lists(_REQUESTS, max_size=4))):
            if layout == "schedule":
                source = records.MessageLogRecord(i, 0, i, 5, -1, 1, records.encode_request(request))
                recs.append(records.encode_schedule_record(source, index=i, store_ts_ms=1))
            else:
                recs.append(wheel.encode_record(request, draw(st.integers(0, 2**50)), 3,
                                                draw(st.sampled_from([None, 1, 18]))))
        positions, sizes, at = [], [], 0
        for record in recs:
            positions.append(_near(draw, at, 8))
            sizes.append(_near(draw, len(record), 8))
            at += len(record)
        buf = draw(st.binary(max_size=300)) if draw(st.integers(0, 5)) == 0 else _mutated(draw, b"".join(recs))
        return {"layout": layout, "buf": buf, "positions": positions, "sizes": sizes}

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**args)
        layout, buf = layouts[args["layout"]], args["buf"]
        requests, extras = native.decode(buf, args["positions"], args["sizes"], layout.packed(), _DROP, AppendRequest,
                                         requestcodec._SETTERS)
        width = len(layout.extras)
        for i, (pos, size) in enumerate(zip(args["positions"], args["sizes"], strict=True)):
            if requests[i] is None:
                continue  # refused: the Python decoder decides, as the plugins do
            python = _outcome(lambda p=pos, s=size: _python_request(args["layout"], buf, p, s))  # type: ignore[misc]
            got = requests[i] if args["layout"] == "schedule" else (requests[i], tuple(extras[i * width:(i + 1) * width]))
            assert python == ("ok", got), f"record {i}: C {got!r} != Python {python!r}"

    _settings(examples)(run)()
    return count[0]


_FUZZ_WORD = st.text(st.sampled_from("aZ9_-#\u00e9\U0001f600"), min_size=1, max_size=4)


@st.composite
def _fuzz_message(draw: st.DrawFn) -> Any:
    """A Message of any kind (or, now and then, something that is not one)."""
    if draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from([None, 3, "T", b"body", AppendRequest("T", 0, b"")]))
    kind = draw(st.sampled_from(["normal"] * 6 + ["fifo", "fifo", "priority", "priority", "level", "at"]))
    return Message(
        "U" if draw(st.integers(0, 19)) == 0 else "T", draw(st.binary(max_size=24)),
        tags=draw(st.one_of(st.none(), _FUZZ_WORD)), keys=draw(st.lists(_FUZZ_WORD, max_size=2)),
        properties=draw(st.dictionaries(_FUZZ_WORD, st.text(max_size=4).filter(lambda t: "\x01" not in t
                                                                                and "\x02" not in t), max_size=2)),
        message_group=draw(_FUZZ_WORD) if kind == "fifo" else None,
        priority=draw(st.integers(0, 2**70)) if kind == "priority" else None,
        delay_level=draw(st.integers(1, 40)) if kind == "level" else None,
        deliver_at_ms=draw(st.integers(0, 2**63)) if kind == "at" else None,
    )


def fuzz_encode(examples: int) -> int:
    """kit ``_requestcodec.encode`` vs its twin ``encode_messages_py``: odd batches, extras, limits."""
    native = requestcodec._native
    count = [0]
    extra = st.one_of(st.none(), st.dictionaries(st.sampled_from([Prop.UNIQ_KEY, Prop.TAGS, "x"]), st.text(max_size=3),
                                                 max_size=2), st.sampled_from([None] * 12 + [3, "ab", [("k", "v")], ()]))

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        batch = draw(st.lists(_fuzz_message(), min_size=draw(st.sampled_from([1] * 5 + [0])), max_size=5))
        shape = draw(st.sampled_from(["none", "none", "each", "each", "any"]))
        extras = None if shape == "none" else draw(st.lists(extra, min_size=len(batch), max_size=len(batch))
                                                   if shape == "each" else st.lists(extra, max_size=6))
        return {"batch": tuple(batch) if draw(st.sampled_from([False] * 9 + [True])) else batch, "extras": extras,
                "queue_id": draw(_ODD_INT), "born": draw(_ODD_INT), "limit": draw(st.sampled_from([2**40] * 4 + [0, 20, 50])),
                "host": draw(st.sampled_from(["127.0.0.1:0", ""])), "reconsume": draw(_ODD_INT),
                "start": draw(st.integers(0, 2**65))}

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**args)
        call = (args["batch"], args["queue_id"], args["born"], args["extras"], args["limit"], args["host"],
                args["reconsume"])
        compiled = _outcome(lambda: native.encode(*call, "PFX", iter(range(args["start"], 2**66)).__next__,
                                                  requestcodec._ENCODE_CONTEXT))
        if compiled == ("ok", None):
            return  # not taken: the twin decides (and raises what is wrong)
        twin = _outcome(lambda: requestcodec.encode_messages_py(
            *call[:5], born_host=args["host"], reconsume_times=args["reconsume"],
            unique_ids=("PFX", iter(range(args["start"], 2**66)).__next__)))
        if compiled[0] == "ok" and twin[0] == "ok":
            compiled = ("ok", (compiled[1], [list(r.properties.items()) for r in compiled[1][0]]))
            twin = ("ok", (twin[1], [list(r.properties.items()) for r in twin[1][0]]))
        _agree(compiled, twin, "encode")

    _settings(examples)(run)()
    return count[0]


class _Appends:
    """A store's append for put_one: records each request and answers as a store would (or refuses)."""

    def __init__(self, status: AppendStatus, refuse: bool) -> None:
        self.requests: list[AppendRequest] = []
        self._status, self._refuse = status, refuse

    def __call__(self, request: AppendRequest) -> AppendResult:
        if self._refuse:
            raise StoreFullError("disk full (fuzz)")
        self.requests.append(request)
        n = len(self.requests)
        return AppendResult.trusted(self._status, f"{n:032X}", n + 6, n * 100, 90, 5)


def fuzz_put_one(examples: int) -> int:
    """kit ``_requestcodec.put_one`` vs its twin ``put_one_py``: odd messages, queue ids, extras,
    limits; a store that answers PUT_OK or FLUSH_DISK_TIMEOUT, or refuses (nothing counted)."""
    native = requestcodec._native
    count = [0]
    extra = st.one_of(st.none(), st.dictionaries(st.sampled_from([Prop.UNIQ_KEY, Prop.TAGS, Prop.SHARDING_KEY, "x"]),
                                                 st.text(max_size=3), max_size=2),
                      st.sampled_from([None] * 8 + [3, "ab", [("k", "v")], ()]))

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        return {"message": draw(_fuzz_message()), "extra": draw(extra),
                "queue_id": draw(st.sampled_from([0, 0, 0, 1, 2, "odd"]).flatmap(
                    lambda q: st.one_of(_ODD_INT, st.sampled_from([True, 1.0, None])) if q == "odd" else st.just(q))),
                "born": draw(st.one_of(st.none(), _ODD_INT)), "limit": draw(st.sampled_from([2**40] * 4 + [0, 20])),
                "queues": draw(st.sampled_from([3, 3, 3, 1, 0])), "start": draw(st.integers(0, 2**65)),
                "status": draw(st.sampled_from(list(AppendStatus))), "refuse": draw(st.sampled_from([False] * 5 + [True])),
                "now": draw(st.sampled_from([None, 12345, "not an int"])),
                # who the wake-up wakes: None (always called), empty lists (not called), someone
                "watchers": draw(st.sampled_from([None, ([], []), ([], [None]), ([print], []), ([],), ()]))}

    def outcome(put: Callable[..., Any], args: dict[str, Any]) -> tuple[Any, ...]:
        appends = _Appends(args["status"], args["refuse"])
        counters = ([0, 0], [0, 0], [0] * 4 + [0.0], (1e-9, 1.0, 100.0))
        woken = []
        queues = [MessageQueue("T", "b", i) for i in range(args["queues"])]
        ids = ("PFX", iter(range(args["start"], 2**66)).__next__)
        now = args["now"]
        plan = requestcodec.put_plan(args["limit"], "127.0.0.1:0", appends, queues, counters, lambda: woken.append(1),
                                     lambda: ids, None if now is None else lambda: now, watchers=args["watchers"])
        sent = _outcome(lambda: put(args["message"], args["queue_id"], args["born"], args["extra"], plan))
        born_now = args["born"] is None and now is None  # the wall clock: equal within the run, not to the ms
        requests = [(attrs.evolve(r, born_timestamp_ms=0) if born_now else r, list(r.properties.items()))
                    for r in appends.requests]
        return sent, requests, counters[:2], sum(counters[2][:-1]), len(woken)

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**{k: repr(v) for k, v in args.items()})
        _agree(outcome(native.put_one, args), outcome(requestcodec.put_one_py, args), "put_one")

    _settings(examples)(run)()
    return count[0]


def fuzz_fill(examples: int) -> int:
    """kit ``_requestcodec.fill`` vs its twin ``fill_slots_py``: slots of the value types (or not
    slots at all), instances of them (or not), values too few or too many."""
    native = requestcodec._native
    classes = [Message, AppendRequest, SendResult, StoredMessage]
    count = [0]
    not_slots = [len, 3, property(lambda self: 1), Message.is_delayed, "topic"]

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        cls = draw(st.sampled_from(classes))
        slots = [cls.__dict__[a.name] for a in attrs.fields(cls)]
        if draw(st.sampled_from([False] * 5 + [True])):
            slots[draw(st.integers(0, len(slots) - 1))] = draw(st.sampled_from(not_slots))
        if draw(st.sampled_from([False] * 5 + [True])):
            slots = slots[:draw(st.integers(0, len(slots)))]
        owner = draw(st.sampled_from([cls] * 5 + classes + [int]))
        values = draw(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.binary(max_size=3)),
                               min_size=max(0, len(slots) - 1), max_size=len(slots) + 1))
        if draw(st.sampled_from([True] * 3 + [False])):
            values = (values + [None] * len(slots))[:len(slots)]
        return {"slots": tuple(slots), "owner": owner, "values": values}

    def filled(fill: Callable[..., None], args: dict[str, Any]) -> Any:
        owner = args["owner"]
        obj = 0 if owner is int else object.__new__(owner)
        fill(args["slots"], obj, *args["values"])
        return [getattr(obj, slot.__name__, "<unset>") if hasattr(slot, "__objclass__") else None
                for slot in args["slots"]]

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**{k: repr(v) for k, v in args.items()})
        _agree(_outcome(lambda: filled(native.fill, args)), _outcome(lambda: filled(fill_slots_py, args)), "fill")

    _settings(examples)(run)()
    return count[0]


_ODD_TEXT = st.text(st.sampled_from("aZ \x01\x02\u00e9\U0001f600\ud800#%"), max_size=6)
_ODD_INT = st.one_of(st.integers(-3, 5), st.integers(-(2**64), 2**64), st.sampled_from([2**31, 2**63, -(2**63) - 1]))


@st.composite
def _odd_request(draw: st.DrawFn) -> AppendRequest:
    """A valid request with some fields replaced by values the store must refuse (or take)."""
    request = draw(st.sampled_from(_requests(2, 20)))
    fields: dict[str, Any] = {"topic": request.topic, "queue_id": request.queue_id, "body": request.body,
              "properties": dict(request.properties), "tags_code": request.tags_code,
              "born_timestamp_ms": request.born_timestamp_ms, "born_host": request.born_host,
              "reconsume_times": request.reconsume_times, "sys_flag": request.sys_flag,
              "prepared_transaction_offset": request.prepared_transaction_offset}
    odd = {"topic": st.one_of(_ODD_TEXT, st.sampled_from(["", "x" * 130, "T/../x", 7])),
           "queue_id": _ODD_INT, "body": st.one_of(st.binary(max_size=40), st.just("text"), st.just(b"x" * 9000)),
           "properties": st.dictionaries(_ODD_TEXT, st.one_of(_ODD_TEXT, st.just(5)), max_size=3),
           "tags_code": _ODD_INT, "born_timestamp_ms": _ODD_INT,
           "born_host": st.one_of(_ODD_TEXT, st.sampled_from(["1.2.3.4:99999", "1.2.3.4:-1", "300.1.1.1:5", None])),
           "reconsume_times": _ODD_INT, "sys_flag": _ODD_INT, "prepared_transaction_offset": _ODD_INT}
    for name in draw(st.lists(st.sampled_from(sorted(odd)), max_size=2)):
        fields[name] = draw(odd[name])
    properties = fields.pop("properties")
    return AppendRequest.trusted(fields.pop("topic"), fields.pop("queue_id"), fields.pop("body"), properties,
                                 **fields)


def _columns(store: MmapMessageStore, batch: list[AppendRequest]) -> list[Any]:
    return list(store.append_columns(batch))


def _append_all(path: Path, kernel: str, calls: list[list[AppendRequest]]) -> tuple[list[Any], Any]:
    """Each call's outcome (``append`` for one request; for more ``append_batch`` and
    ``append_columns`` taking turns, the compiled kernel's turns opposite the Python one's, so each
    is compared with the other) and a key query."""
    store = _open_store(path, kernel)
    turn = kernel == "c"
    try:
        answers = [_outcome(functools.partial(store.append, batch[0]) if len(batch) == 1
                            else functools.partial(_columns if (i % 2 == 0) == turn else MmapMessageStore.append_batch,
                                                   store, batch)) for i, batch in enumerate(calls)]
        return answers, _outcome(lambda: [m.commit_log_offset for m in store.query_by_key("TopicA", "k1")])
    finally:
        store.close()


def fuzz_appender(examples: int) -> int:
    """store_mmap ``_appender.Appender`` (bind, put, append_one, append, append_batch,
    append_columns, take_pending, release, all through the store) vs ``PyAppender``: the same
    results, refusals and files (and append_columns the same as append_batch)."""
    count = [0]

    @given(st.lists(st.lists(_odd_request(), min_size=1, max_size=3), min_size=1, max_size=6))
    def run(calls: list[list[AppendRequest]]) -> None:
        count[0] += 1
        _note(calls=calls)
        seen = {}
        with tempfile.TemporaryDirectory(dir=_SCRATCH) as tmp:
            for kernel in ("c", "python"):
                answers, hits = _append_all(Path(tmp) / kernel, kernel, calls)
                seen[kernel] = (answers, hits, files(Path(tmp) / kernel))
        (c_answers, c_hits, c_files), (py_answers, py_hits, py_files) = seen["c"], seen["python"]
        for i, (c, py) in enumerate(zip(c_answers, py_answers, strict=True)):
            _agree(c, py, f"call {i}")
        assert c_hits == py_hits, "key queries differ"
        assert c_files == py_files, "the kernels wrote different files"

    _settings(examples)(run)()
    return count[0]


def _fused_as_general(put_all: Callable[[Path, bool, dict[str, Any]], tuple[Any, ...]], args: dict[str, Any],
                      what: str) -> None:
    """``put_all`` through the direct append and through the general path, on two fresh stores:
    the same outcomes and the same files."""
    with tempfile.TemporaryDirectory(dir=_SCRATCH) as tmp:
        _agree(put_all(Path(tmp) / "direct", True, args), put_all(Path(tmp) / "general", False, args), what)
        assert files(Path(tmp) / "direct") == files(Path(tmp) / "general"), "the two paths wrote different files"


def _plain_message() -> Any:
    """A Message put_one and put_batch take (not delayed, no priority), mostly to topic T."""
    return _fuzz_message().filter(lambda m: type(m) is Message and not m.is_delayed and m.priority is None)


def _put_all(path: Path, direct: bool, args: dict[str, Any]) -> tuple[Any, ...]:
    """put_one's outcomes on a real store: the compiled put_one through the store's direct append,
    or the twin through its ``append``; then the counters, wake-ups, key and id queries, files."""
    store = _open_store(path, "c")
    counters = ([0, 0], [0, 0], [0] * 4 + [0.0], (1e-9, 1.0, 100.0))
    woken: list[int] = []
    ids = ("PFX", iter(range(args["start"], 2**66)).__next__)
    queues = [MessageQueue("T", "b", i) for i in range(3)]
    capsule = store.direct_append() if direct else None
    assert capsule is not None or not direct, "store_mmap offers no direct append"
    plan = requestcodec.put_plan(args["limit"], args["host"], store.append, queues, counters, lambda: woken.append(1),
                                 lambda: ids, lambda: 12345, direct=capsule)
    put = requestcodec._native.put_one if direct else requestcodec.put_one_py
    try:
        sent = [_outcome(functools.partial(put, message, queue_id, born, extra, plan))
                for message, queue_id, born, extra in args["calls"]]
        keys = _outcome(lambda: [m.commit_log_offset for m in store.query_by_key("T", "k1")])
        by_id = [_outcome(functools.partial(store.query_by_id, s[1].msg_id)) for s in sent if s[0] == "ok" and s[1]]
        return sent, counters[:2], sum(counters[2][:-1]), len(woken), keys, by_id
    finally:
        store.close()


def fuzz_put_direct(examples: int) -> int:
    """kit ``_requestcodec.put_one`` through store_mmap's direct append (DirectAppending) vs its
    twin through the store's ``append``: the same answers, errors, counters, wake-ups, queries and
    files, for odd messages, extras, queue ids, born hosts and size limits."""
    count = [0]
    extra = st.one_of(st.none(), st.dictionaries(st.sampled_from([Prop.UNIQ_KEY, Prop.KEYS, "x", "a\x01b"]),
                                                 st.sampled_from(["", "k1", "k1 k2", "v\x02", "\udc80"]), max_size=2))

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        calls = draw(st.lists(st.tuples(st.one_of(_plain_message(), _fuzz_message()), st.sampled_from([0, 0, 1, 2, -1, 2**40]),
                                        st.sampled_from([None, None, 7, -(2**63), 2**64]), extra), min_size=1, max_size=4))
        return {"calls": calls, "start": draw(st.integers(0, 2**65)),
                "limit": draw(st.sampled_from([2**20] * 4 + [0, 10])),
                "host": draw(st.sampled_from(["127.0.0.1:0"] * 3 + ["[::1]:9", "bad"]))}

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**{k: repr(v) for k, v in args.items()})
        _fused_as_general(_put_all, args, "put_one direct")

    _settings(examples)(run)()
    return count[0]


def _put_batches(path: Path, direct: bool, args: dict[str, Any]) -> tuple[Any, ...]:
    """put_batch's outcomes on a real store: the compiled put_batch through the store's direct
    append (or, declining, its append_columns), or the twin through append_columns."""
    store = _open_store(path, "c")
    admitted: list[tuple[int, int]] = []
    ids = ("PFX", iter(range(args["start"], 2**66)).__next__)
    capsule = store.direct_append() if direct else None
    put = requestcodec.put_batch if direct else requestcodec.put_batch_py

    def admit(count: int, total: int) -> None:
        admitted.append((count, total))
        if total == args["refuse_total"]:
            raise ValidationError("refused by admit (fuzz)")

    try:
        answers = []
        for batch, queue_id, extras in args["calls"]:
            got = _outcome(functools.partial(put, batch, queue_id, 77, extras, args["limit"], capsule,
                                             store.append_columns, admit, unique_ids=ids))
            if got[0] == "ok" and got[1] is not None:
                got = ("ok", (list(got[1][0]), got[1][1], got[1][2]))
            answers.append(got)
        keys = _outcome(lambda: [m.commit_log_offset for m in store.query_by_key("T", "k1")])
        return answers, admitted, keys
    finally:
        store.close()


def fuzz_put_batch_direct(examples: int) -> int:
    """kit ``_requestcodec.put_batch`` through store_mmap's direct append vs its twin
    ``put_batch_py`` through the store's ``append_columns``: the same answers, refusals, admitted
    counts, queries and files, for odd batches, extras, queue ids and size limits."""
    count = [0]
    extra = st.one_of(st.none(), st.dictionaries(st.sampled_from([Prop.UNIQ_KEY, Prop.KEYS, "x", "a\x01b"]),
                                                 st.sampled_from(["", "k1", "k1 k2", "v\x02"]), max_size=2))

    @st.composite
    def case(draw: st.DrawFn) -> dict[str, Any]:
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            batch = draw(st.lists(_plain_message() if draw(st.sampled_from([True] * 3 + [False])) else _fuzz_message(),
                                  min_size=draw(st.sampled_from([1] * 9 + [0])), max_size=4))
            shape = draw(st.sampled_from(["none", "none", "each", "each", "each", "any"]))
            extras = None if shape == "none" else draw(st.lists(extra, min_size=len(batch), max_size=len(batch))
                                                       if shape == "each" else st.lists(extra, max_size=5))
            calls.append((tuple(batch) if draw(st.sampled_from([False] * 9 + [True])) else batch,
                          draw(st.sampled_from([0, 0, 0, 1, -1, 2**40])), extras))
        return {"calls": calls, "start": draw(st.integers(0, 2**65)),
                "limit": draw(st.sampled_from([2**20] * 8 + [0, 30])),
                "refuse_total": draw(st.sampled_from([-1, -1, -1, 0, 5]))}

    @given(case())
    def run(args: dict[str, Any]) -> None:
        count[0] += 1
        _note(**{k: repr(v) for k, v in args.items()})
        _fused_as_general(_put_batches, args, "put_batch direct")

    _settings(examples)(run)()
    return count[0]


TARGETS: dict[str, Callable[[int], int]] = {
    "store_mmap._scan.scan": fuzz_scan,
    "store_mmap._scan.check_entries": fuzz_check_entries,
    "store_mmap._scan.read_run": fuzz_read_run,
    "store_mmap._appender.Appender": fuzz_appender,
    "delay_schedule._segscan.scan": fuzz_segscan,
    "delay_schedule._segscan.encode_dispatch": fuzz_encode_dispatch,
    "kit._requestcodec.decode": fuzz_requestcodec,
    "kit._requestcodec.encode": fuzz_encode,
    "kit._requestcodec.fill": fuzz_fill,
    "kit._requestcodec.put_one": fuzz_put_one,
    "kit._requestcodec.put_one+store_mmap direct append": fuzz_put_direct,
    "kit._requestcodec.put_batch+store_mmap direct append": fuzz_put_batch_direct,
}


def _settings(examples: int) -> Any:
    return settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


def main(argv: list[str]) -> int:
    global _last_input
    target, examples = argv[0], int(argv[1])
    _last_input = Path(argv[2]) if len(argv) > 2 else None
    ran = TARGETS[target](examples)
    print(json.dumps({"target": target, "examples": ran}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
