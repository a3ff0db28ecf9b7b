"""The append path of store_mmap: encode records and place them in the commit log and consume queues.

Two implementations with one contract and byte-identical output:

* ``CAppender``: the compiled kernel (``_appender.c``, built by ``pip install``), one C call per
  append or per batch. It is the default because in CPython the per-field work of an append
  (packing, two CRCs, the consume-queue entry, the result object) costs about as much as a whole
  raw append each; the compiled kernel does all of it in about the time of one.
* ``PyAppender``: the same algorithm in Python, the reference for the kernel and the fallback
  where it could not be built (``append_kernel = "python"`` forces it).

Contract, for both. The store binds its put lock, write gate and Python halves once
(``bind(lock, retention, check_writable, provide, make_room, drain, index_batch, closed_message)``);
then

``append(request) -> AppendResult``, ``append_batch(requests) -> list[AppendResult]`` and
``append_columns(requests) -> (rows, store_ts)``
    are the store's appends up to the flush: refuse when ``closed`` is set or the disk is full
    (``check_writable()`` runs when ``retention.full`` is set or ``retention.next_check`` has
    passed), take the put lock, encode every request (a refused one raises before anything is
    written), for a batch call ``make_room(queue_counts, record_sizes)`` (records per (topic,
    queue id), and the size of each record: every disk block the batch will write into is
    allocated first, so a full disk refuses all of it), place the requests -
    calling ``provide(appender)`` at each file boundary (see ``need`` below) - release the lock
    and, when ``pending_count`` reaches ``index_batch``, call ``drain()``. ``append_columns`` is
    ``append_batch`` answering, instead of AppendResults, ``rows``: native int64 (queue offset,
    commit-log offset, size) triples, one per record, and the batch's one store timestamp (the
    last one, ``last_ts``, for an empty batch). The lower-level calls
    below run under the put lock:

``put(requests, start, results) -> int``
    Check and encode every request of ``requests[start:]`` first - a refused request raises
    before anything is written - then write each record into the current commit-log segment and
    its entry into its consume queue, append one AppendResult per record to ``results`` and
    publish the new commit-log end, then the new queue ends (readers never look past them). It
    returns the index of the first request not placed: the compiled kernel stops where a file
    boundary needs Python - ``need`` says which (NEED_ROLL: roll the commit log for a record of
    ``need_size`` bytes; NEED_ALLOCATE: give the current segment disk blocks up to byte
    ``need_size``; NEED_CQ_FILE: prepare ``need_cq``'s file, with blocks, for entry ``need_qoff``;
    NEED_QUEUE: create queue ``need_topic``/``need_qid``); the caller provides it and calls again.
    Every byte gets its blocks before it is written: a full disk is a StoreFullError, never a
    SIGBUS.
``append_one(request) -> AppendResult | None``
    The same for one request (None: provide ``need`` and call again).
``release()``
    Drop the buffers kept between calls (the compiled kernel keeps the current segment's and the
    queues' current files' buffers); the store calls it before closing its files.
``take_pending()`` (under the lock), then ``pending_entries(taken) -> (hashes, offsets, times)``
    The index entries (RocketMQ key hash of ``topic#key``, commit-log offset, store time) noted
    since the last take, in commit-log order; ``pending_count`` counts them.

All records of one call share one store timestamp (never earlier than the previous one).
"""

from __future__ import annotations

import struct
import time
import zlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from plugmq.core import AppendRequest, AppendResult, AppendStatus, Prop, StoreError, ValidationError
from plugmq.core.message import check_body_size
from plugmq.kit.native import load_kernel
from plugmq.plugins.store_mmap.indexfile import key_entries
from plugmq.plugins.store_mmap.layout import APPEND_KERNEL
from plugmq.plugins.store_mmap.record import (
    _HOSTS,
    BORN_HOST_PROPERTY,
    END_FILE_MIN_BLANK,
    FLAG_BORN_HOST_IN_PROPS,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    QUEUE_AND_PHYS,
    QUEUE_AND_PHYS_AT,
    RCRC,
    RECORD_CRC_AT,
    RECORD_CRC_FROM,
    STORE_TS,
    STORE_TS_AT,
    build_tail,
    host_bytes,
    record_struct,
    serialize_properties,
)

if TYPE_CHECKING:
    from plugmq.plugins.store_mmap.commitlog import CommitLog
    from plugmq.plugins.store_mmap.consumequeue import ConsumeQueues

__all__ = [
    "KERNELS",
    "NEED_ALLOCATE",
    "NEED_CQ_FILE",
    "NEED_NONE",
    "NEED_QUEUE",
    "NEED_ROLL",
    "Appender",
    "PyAppender",
    "compiled_kernel",
    "make_appender",
]

NEED_NONE, NEED_ROLL, NEED_CQ_FILE, NEED_QUEUE, NEED_ALLOCATE = 0, 1, 2, 3, 4
KERNELS = ("auto", "c", "python")
_PENDING = np.dtype(np.int64)
_NO_HOST = bytes(8)
_PUT_OK = AppendStatus.PUT_OK

IndexEntries = tuple[np.ndarray, np.ndarray, np.ndarray]  # key hashes, commit-log offsets, store times
TopicInfo = tuple[bytes, bytes, int]  # (length-prefixed topic, tail without properties, CRC of that tail)


class Appender(Protocol):
    """What the store needs of an append kernel (see the module docstring)."""

    last_ts: int

    @property
    def messages(self) -> int: ...
    @property
    def appended_bytes(self) -> int: ...
    @property
    def pending_count(self) -> int: ...
    @property
    def need(self) -> int: ...
    @property
    def need_size(self) -> int: ...
    @property
    def need_qoff(self) -> int: ...
    @property
    def need_qid(self) -> int: ...
    @property
    def need_cq(self) -> Any: ...
    @property
    def need_topic(self) -> str | None: ...

    closed: bool
    direct: bool  # the compiled kernel's direct append is taken (set by the store under its put lock)

    def bind(self, *, lock: Any, retention: Any, check_writable: Callable[[], None],
             provide: Callable[[Any], None], make_room: Callable[[dict[tuple[str, int], int], list[int]], None],
             drain: Callable[[], object], index_batch: int, closed_message: str) -> None: ...
    def append(self, request: AppendRequest) -> AppendResult: ...
    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]: ...
    def append_columns(self, requests: Sequence[AppendRequest]) -> tuple[bytes, int]: ...
    def put(self, requests: Sequence[AppendRequest], start: int, results: list[AppendResult]) -> int: ...
    def append_one(self, request: AppendRequest) -> AppendResult | None: ...
    def take_pending(self) -> Any: ...
    def pending_entries(self, taken: Any) -> IndexEntries: ...
    def release(self) -> None: ...
    def direct_capsule(self) -> object: ...


_COMPILED_MODULE = load_kernel(APPEND_KERNEL)


def compiled_kernel() -> Any:
    """The ``_appender`` extension module, or None when it is not built for this layout."""
    return _COMPILED_MODULE


class PyAppender:
    """The append path in Python (the reference of the compiled kernel, and its fallback)."""

    need = NEED_NONE
    need_size = need_qoff = need_qid = 0
    need_cq: Any = None
    need_topic: str | None = None
    direct = False  # no direct append in Python: the store never offers one for this kernel

    def __init__(
        self,
        *,
        commit_log: CommitLog,
        consume_queues: ConsumeQueues,
        topics: dict[str, TopicInfo],
        learn_topic: Callable[[str], TopicInfo],
        now_ms: Callable[[], int],
        store_host: bytes,
        id_prefix: str,
        max_body: int,
        max_record: int,
        index_unique: bool,
        last_ts: int,
        system_clock: bool = False,
    ) -> None:
        self._cl = commit_log
        self._cqs = consume_queues
        self._topics = topics
        self._learn_topic = learn_topic
        self._now_ms = now_ms
        self._store_host = store_host
        self._id_prefix = id_prefix
        self._max_body = max_body
        self._max_record = max_record
        self._index_unique = index_unique
        self.last_ts = last_ts
        self.messages = 0
        self.appended_bytes = 0
        self._pending: list[tuple[str, str | None, str | None, int, int]] = []
        self.closed = False
        self._lock: Any = None
        self._retention: Any = None
        self._check_writable: Callable[[], None] = _unbound
        self._make_room: Callable[[dict[tuple[str, int], int], list[int]], None] = _unbound_room
        self._drain: Callable[[], object] = _unbound
        self._index_batch = 1
        self._closed_message = ""

    def bind(self, *, lock: Any, retention: Any, check_writable: Callable[[], None],
             provide: Callable[[Any], None], make_room: Callable[[dict[tuple[str, int], int], list[int]], None],
             drain: Callable[[], object], index_batch: int, closed_message: str) -> None:
        self._lock = lock
        self._retention = retention
        self._check_writable = check_writable
        self._make_room = make_room
        self._drain = drain
        self._index_batch = index_batch
        self._closed_message = closed_message  # provide: not needed, this kernel crosses files itself

    def _gate(self) -> None:
        if self.closed:
            raise StoreError(self._closed_message)
        retention = self._retention
        if retention.full or time.monotonic() >= retention.next_check:
            self._check_writable()

    def append(self, request: AppendRequest) -> AppendResult:
        self._gate()
        with self._lock:
            if self.closed:
                raise StoreError(self._closed_message)
            result = self.append_one(request)
        if len(self._pending) >= self._index_batch:
            self._drain()
        return result

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        results: list[AppendResult] = []
        if not requests:
            return results
        self._gate()
        with self._lock:
            if self.closed:
                raise StoreError(self._closed_message)
            encoded = [self._encode(r) for r in requests]  # every request is checked first
            counts: dict[tuple[str, int], int] = {}
            for request in requests:
                key = (request.topic, request.queue_id)
                counts[key] = counts.get(key, 0) + 1
            self._make_room(counts, [len(e[0]) for e in encoded])
            self._place(requests, encoded, results)
        if len(self._pending) >= self._index_batch:
            self._drain()
        return results

    def append_columns(self, requests: Sequence[AppendRequest]) -> tuple[bytes, int]:
        results = self.append_batch(requests)
        rows = array("q", [n for r in results for n in (r.queue_offset, r.commit_log_offset, r.size)])
        return rows.tobytes(), results[0].store_timestamp_ms if results else self.last_ts

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # -- encoding -----------------------------------------------------------------------------

    def _encode(self, req: AppendRequest) -> tuple[bytes, int, str | None, str | None]:
        """The record with queue offset, physical offset, store time and record CRC left zero
        (patched under the lock); the CRC of its tail; the keys and unique id to index."""
        topic = req.topic
        if not isinstance(topic, str):
            raise ValidationError(f"topic must be a string, got {topic!r}")
        known = self._topics.get(topic)
        if known is None:
            known = self._learn_topic(topic)
        queue_id = _checked_queue_id(req.queue_id)
        body = req.body
        if not isinstance(body, bytes):
            raise ValidationError(f"append request body must be bytes, got {type(body).__name__}")
        body_len = len(body)
        if body_len > self._max_body:
            check_body_size(body, self._max_body, topic=topic)
        _check_int_fields(req)
        born, flag, props = _born_host(req.born_host, req.properties)
        if props:
            tail = build_tail(known[0], serialize_properties(props))
            tail_crc = zlib.crc32(tail)
            keys = props.get(Prop.KEYS)
            uniq = props.get(Prop.UNIQ_KEY) if self._index_unique else None
        else:
            tail, tail_crc = known[1], known[2]
            keys = uniq = None
        total = HEADER_SIZE + body_len + len(tail)
        if total > self._max_record:
            raise StoreError(
                f"a record of {total} bytes (body {body_len}, topic and properties {len(tail)}, header "
                f"{HEADER_SIZE}) does not fit a commit-log segment of {self._max_record + END_FILE_MIN_BLANK} "
                f"bytes (at most {self._max_record} per record); raise commit_log_segment_size or send less"
            )
        try:
            record = record_struct(body_len, len(tail)).pack(
                total, MESSAGE_MAGIC, 0, zlib.crc32(body), queue_id, flag, 0, 0, req.sys_flag,
                req.born_timestamp_ms, born, 0, self._store_host, req.reconsume_times,
                req.prepared_transaction_offset, req.tags_code, body_len, body, tail,
            )  # fmt: skip
        except struct.error as exc:
            raise ValidationError(
                f"append request field out of range ({exc}): queue_id, sys_flag and reconsume_times must "
                f"fit int32; born_timestamp_ms, prepared_transaction_offset and tags_code int64"
            ) from exc
        return record, tail_crc, keys or None, uniq or None

    # -- placing ------------------------------------------------------------------------------

    def put(self, requests: Sequence[AppendRequest], start: int, results: list[AppendResult]) -> int:
        encoded = [self._encode(r) for r in requests[start:]]  # every request is checked first
        self._place(requests[start:], encoded, results)
        return len(requests)

    def _place(self, requests: Sequence[AppendRequest], encoded: list[tuple[bytes, int, str | None, str | None]],
               results: list[AppendResult]) -> None:
        if not encoded:
            return
        ts = max(self._now_ms(), self.last_ts)
        self.last_ts = ts
        cl, cqs, prefix = self._cl, self._cqs, self._id_prefix
        for req, (record, tail_crc, keys, uniq) in zip(requests, encoded):
            topic, qid, tags = req.topic, req.queue_id, req.tags_code
            cq = cqs.queues.get((topic, qid)) or cqs.create(topic, qid)
            qoff = cq.max_offset
            if cq._cur is None or not 0 <= qoff - cq._cur_base < cq.room:
                cq.prepare(qoff)  # the entry's blocks before the record is written (a full disk refuses here)
            total = len(record)
            seg = cl.cur
            assert seg is not None
            pos = cl.wrote - seg.start
            if pos + total + END_FILE_MIN_BLANK > seg.size:
                seg, pos = cl.reserve(total)
            if pos + total + END_FILE_MIN_BLANK > seg.allocated:
                cl.allocate(seg, pos + total + END_FILE_MIN_BLANK)  # blocks first: StoreFullError, never SIGBUS
            phys = seg.start + pos
            mm = seg.mm
            mm[pos : pos + total] = record
            QUEUE_AND_PHYS.pack_into(mm, pos + QUEUE_AND_PHYS_AT, qoff, phys)
            STORE_TS.pack_into(mm, pos + STORE_TS_AT, ts)
            RCRC.pack_into(mm, pos + RECORD_CRC_AT, zlib.crc32(mm[pos + RECORD_CRC_FROM : pos + HEADER_SIZE], tail_crc))
            cl.wrote = phys + total  # published before the queue entry that points at it
            cq.put(qoff, phys, total, tags)
            if keys or uniq:
                self._pending.append((topic, keys, uniq, phys, ts))
            self.messages += 1
            self.appended_bytes += total
            results.append(AppendResult(_PUT_OK, f"{prefix}{phys:016X}", qoff, phys, total, ts))

    def append_one(self, request: AppendRequest) -> AppendResult:
        results: list[AppendResult] = []
        self.put((request,), 0, results)
        return results[0]

    def release(self) -> None:
        """Nothing to let go of: this kernel keeps no buffers between calls."""

    def direct_capsule(self) -> object:
        raise StoreError("store_mmap's Python append kernel has no direct append (only the compiled one)")

    def take_pending(self) -> list[tuple[str, str | None, str | None, int, int]]:
        batch, self._pending = self._pending, []
        return batch

    @staticmethod
    def pending_entries(taken: list[tuple[str, str | None, str | None, int, int]]) -> IndexEntries:
        return key_entries(taken)


def _unbound() -> None:
    raise RuntimeError("PyAppender.bind() was not called")


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT_FIELDS = (("sys_flag", _INT32), ("reconsume_times", _INT32), ("born_timestamp_ms", _INT64),
               ("prepared_transaction_offset", _INT64), ("tags_code", _INT64))


def _out_of_range(name: str, value: int) -> None:
    raise ValidationError(
        f"append request field out of range ({name} = {value!r}): queue_id, sys_flag and reconsume_times must "
        "fit int32; born_timestamp_ms, prepared_transaction_offset and tags_code int64"
    )


def _unbound_room(_counts: dict[tuple[str, int], int], _sizes: list[int]) -> None:
    raise RuntimeError("PyAppender.bind() was not called")


def make_appender(kernel: str, **settings: Any) -> Appender:
    """The append kernel named by the ``append_kernel`` option ("auto": compiled when built)."""
    module = compiled_kernel() if kernel in ("auto", "c") else None
    if module is None:
        if kernel == "c":
            raise StoreError(
                "store_mmap.append_kernel = \"c\" but the compiled kernel plugmq.plugins.store_mmap._appender "
                "is not built for this layout; reinstall plugmq with a C compiler and the Python headers "
                "(pip install -e .), or use append_kernel = \"auto\" or \"python\""
            )
        return PyAppender(**settings)  # "auto": plugmq.kit.native said once what falls back
    return _compiled_class(module)(**_compiled_settings(module, settings))


_COMPILED: dict[int, type] = {}


def _compiled_class(module: Any) -> type:
    found = _COMPILED.get(id(module))
    if found is None:

        class CAppender(module.Appender):
            """The compiled kernel plus the Python half of ``pending_arrays``."""

            __slots__ = ()

            @staticmethod
            def pending_entries(taken: bytes) -> IndexEntries:
                raw = np.frombuffer(taken, dtype=_PENDING).reshape(-1, 3)
                return raw[:, 0], raw[:, 1], raw[:, 2]

        found = _COMPILED[id(module)] = CAppender
    return found


def _compiled_settings(module: Any, settings: dict[str, Any]) -> dict[str, Any]:
    cl: CommitLog = settings["commit_log"]
    return {
        "store_host": settings["store_host"],
        "id_prefix": settings["id_prefix"],
        "topics": settings["topics"],
        "learn_topic": settings["learn_topic"],
        "hosts": _HOSTS,
        "host_bytes": host_bytes,
        "queues": settings["consume_queues"].queues,
        "commit_log": cl,
        "now_ms": None if settings.get("system_clock") else settings["now_ms"],
        "check_body_size": check_body_size,
        "validation_error": ValidationError,
        "store_error": StoreError,
        "request_type": AppendRequest,
        "result_type": AppendResult,
        "put_ok": _PUT_OK,
        "keys_name": Prop.KEYS,
        "uniq_name": Prop.UNIQ_KEY,
        "born_host_name": BORN_HOST_PROPERTY,
        "max_body": settings["max_body"],
        "max_record": settings["max_record"],
        "segment_size": cl.segment_size,
        "index_unique": settings["index_unique"],
        "last_ts": settings["last_ts"],
    }


def _checked_queue_id(queue_id: object) -> int:
    if not isinstance(queue_id, int):
        raise ValidationError(f"append request field queue_id must be an int, got {queue_id!r}")
    if queue_id < 0:
        raise ValidationError(f"queue id must be >= 0, got {queue_id}")
    if queue_id > _INT32[1]:
        _out_of_range("queue_id", queue_id)
    return queue_id


def _check_int_fields(req: AppendRequest) -> None:
    for name, (low, high) in _INT_FIELDS:  # in the compiled kernel's order, with its words
        value = getattr(req, name)
        if not isinstance(value, int):
            raise ValidationError(f"append request field {name} must be an int, got {value!r}")
        if not low <= value <= high:
            _out_of_range(name, value)


def _born_host(born_host: object, props: Mapping[str, str]) -> tuple[bytes, int, Mapping[str, str]]:
    """The born host as the record's 8 bytes, the flag, and the properties (a host that is not
    IPv4 ``ip:port`` goes into a property, as RocketMQ does for IPv6)."""
    if not isinstance(born_host, str):
        raise ValidationError(f"born_host must be a string 'ip:port', got {born_host!r}")
    born = _HOSTS.get(born_host, b"")
    if born == b"":
        born = host_bytes(born_host)
    if born is not None:
        return born, 0, props
    moved = {k: v for k, v in props.items() if k != BORN_HOST_PROPERTY}
    moved[BORN_HOST_PROPERTY] = born_host
    return _NO_HOST, FLAG_BORN_HOST_IN_PROPS, moved
