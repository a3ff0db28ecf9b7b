"""Checking the commit log and the consume queues when a store opens: the recovery scan.

Two kernels with one contract and identical results, as for the append path:

* the compiled one (``_scan.c``, built by ``pip install``), the default: it checks a record (magic,
  sizes, offset, both CRCs) and notes what recovery needs of it without creating an object per
  record;
* ``PyScanKernel`` below: the same rules in Python, the reference for the compiled one and the
  fallback where it could not be built (``scan_kernel = "python"`` forces it).

Kernel contract (one segment at a time, see ``_scan.c`` for the full text):

``scan(buffer, pos, readable, seg_size, seg_start, limit, rows, keys, keys_name, uniq_name,
topic_ids, topic_names) -> (stop, kind, count, last_ts, rows_bytes | None, keys_bytes | None)``
    walk the sound records from ``pos``; stop at an unsound one (STOP_BAD), the end-of-segment
    blank marker (STOP_BLANK) or ``limit`` (STOP_LIMIT); rows of 7 native int64 per record
    (phys, total, queue id, queue offset, tags code, store time, topic number) and index entries
    (key hash, phys, store time) on request.
``check_entries(entries, first_qoff, queue_id, log_end, segments) -> bytes``
    one byte per 20-byte consume-queue entry: 1 when the record it points at matches it.
``read_records(offsets, segments, stored_type, setters, born_host_name) -> list``
    the reads of a run of records (pulls, pop receives): the StoredMessage at each commit-log
    offset, or None where ``CommitLog.read`` finds no sound record; ``segments`` are
    ``(start, end, limit, buffer)``. The compiled kernel builds the messages as
    ``StoredMessage.trusted`` does, through the type and the slot descriptors it is handed
    (:data:`STORED_TYPE`, :data:`STORED_SETTERS`); the Python one decodes and converts each record
    as ``read`` does.
``read_run(entries, first_qoff, queue_id, topic, segments, stored_type, setters, born_host_name)
-> list | None``
    a plain pull's run in one call: the messages of a run of one queue's 20-byte consume-queue
    entries (no ConsumeQueueEntry built) when each entry's record is sound and exactly what the
    entry says (size, tags code, queue id, queue offset, topic); None as soon as one is not, and
    the caller reads that stretch entry by entry (its checks and repairs decide).
``queue_entries(entries, first_qoff, entry_type, setters) -> list``
    a ConsumeQueueEntry per 20-byte entry (``read_queue``), built as ``read_records`` builds
    messages (:data:`ENTRY_SETTERS`).

:func:`scan_log` runs a kernel over the log (segment after segment, skipping damage followed by
sound records) and returns a :class:`LogScan`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from plugmq.core import ConsumeQueueEntry, Prop, StoredMessage, StoreError
from plugmq.kit.native import load_kernel
from plugmq.plugins.store_mmap.layout import SCAN_KERNEL
from plugmq.plugins.store_mmap.record import (
    BLANK,
    BLANK_MAGIC,
    END_FILE_MIN_BLANK,
    HEAD,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    Decoded,
    decode,
)

if TYPE_CHECKING:
    from plugmq.plugins.store_mmap.commitlog import CommitLog

__all__ = [
    "ENTRY_SETTERS",
    "KERNELS",
    "ROW_FIELDS",
    "STOP_BAD",
    "STOP_BLANK",
    "STOP_LIMIT",
    "STORED_FIELDS",
    "STORED_SETTERS",
    "STORED_TYPE",
    "Damage",
    "LogScan",
    "PyScanKernel",
    "ScanKernel",
    "compiled_scan_kernel",
    "entry_reader",
    "make_scan_kernel",
    "next_sound",
    "scan_log",
]

KERNELS = ("auto", "c", "python")
STOP_BAD, STOP_BLANK, STOP_LIMIT = 0, 1, 2
ROW_FIELDS = 7  # phys, total, queue id, queue offset, tags code, store time, topic number
PHYS, TOTAL, QUEUE_ID, QUEUE_OFFSET, TAGS, STORE_TS, TOPIC = range(ROW_FIELDS)
KEYS_NAME = Prop.KEYS.encode()
UNIQ_NAME = Prop.UNIQ_KEY.encode()
_NO_LIMIT = 1 << 62
_MAGIC_BYTES = struct.pack(">I", MESSAGE_MAGIC)
_MAGIC_AT = 4  # the magic's position inside a record
_ENTRY = struct.Struct(">qiq")
#: The StoredMessage fields in the order the compiled ``read_records`` sets them (a test checks
#: they are all of them); the kernel gets the class and its slot descriptors, as ``trusted`` uses.
STORED_FIELDS = ("topic", "queue_id", "body", "properties", "queue_offset", "commit_log_offset", "size", "tags_code",
                 "born_timestamp_ms", "store_timestamp_ms", "born_host", "store_host", "reconsume_times", "sys_flag",
                 "prepared_transaction_offset", "body_crc")
STORED_TYPE = StoredMessage
STORED_SETTERS = tuple(getattr(StoredMessage, name) for name in STORED_FIELDS)
ENTRY_SETTERS = tuple(getattr(ConsumeQueueEntry, a.name) for a in attrs.fields(ConsumeQueueEntry))


class ScanKernel(Protocol):
    """What recovery needs of a scan kernel (see the module docstring)."""

    def scan(self, buffer: Any, pos: int, readable: int, seg_size: int, seg_start: int, limit: int, rows: bool,
             keys: int, keys_name: bytes, uniq_name: bytes, topic_ids: dict[bytes, int],
             topic_names: list[str]) -> tuple[int, int, int, int, bytes | None, bytes | None]: ...

    def check_entries(self, entries: bytes, first_qoff: int, queue_id: int, log_end: int,
                      segments: Sequence[tuple[int, int, Any]]) -> bytes: ...

    def read_records(self, offsets: Sequence[int], segments: Sequence[tuple[int, int, int, Any]],
                     stored_type: type[StoredMessage], setters: tuple[Any, ...],
                     born_host_name: str) -> list[StoredMessage | None]: ...

    def read_run(self, entries: bytes, first_qoff: int, queue_id: int, topic: bytes,
                 segments: Sequence[tuple[int, int, int, Any]], stored_type: type[StoredMessage],
                 setters: tuple[Any, ...], born_host_name: str) -> list[StoredMessage] | None: ...

    def queue_entries(self, entries: bytes, first_qoff: int, entry_type: type[ConsumeQueueEntry],
                      setters: tuple[Any, ...]) -> list[ConsumeQueueEntry]: ...


# ------------------------------------------------------------------------------------------------
# the Python kernel
# ------------------------------------------------------------------------------------------------


def _java_hash(text: str, seed: int) -> int:
    h = seed
    for unit in struct.unpack(f"<{len(text.encode('utf-16-le', 'surrogatepass')) // 2}H",
                              text.encode("utf-16-le", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h


def _index_hash(h: int) -> int:
    signed = h - (1 << 32) if h & 0x80000000 else h
    return 0 if signed == -(1 << 31) else abs(signed)


def _property_values(raw: bytes, keys_name: bytes, uniq_name: bytes | None) -> tuple[bytes | None, bytes | None]:
    """The raw KEYS and unique-id values of ``key\\x01value\\x02...`` (the last of a name wins)."""
    keys = uniq = None
    for item in raw.split(b"\x02"):
        if not item:
            continue
        name, _, value = item.partition(b"\x01")
        if name == keys_name:
            keys = value
        elif uniq_name is not None and name == uniq_name:
            uniq = value
    return keys, uniq


class PyScanKernel:
    """The recovery scan in Python (the reference of ``_scan.c``, and its fallback)."""

    @staticmethod
    def scan(buffer: Any, pos: int, readable: int, seg_size: int, seg_start: int, limit: int, rows: bool,
             keys: int, keys_name: bytes, uniq_name: bytes, topic_ids: dict[bytes, int],
             topic_names: list[str]) -> tuple[int, int, int, int, bytes | None, bytes | None]:
        readable = min(readable, len(buffer))
        out_rows: list[int] = []
        out_keys: list[int] = []
        count = 0
        last_ts = -1
        kind = STOP_BAD
        while True:
            if pos >= limit:
                kind = STOP_LIMIT
                break
            if pos >= 0 and pos + BLANK.size <= min(seg_size, readable + END_FILE_MIN_BLANK, len(buffer)):
                total, magic = BLANK.unpack_from(buffer, pos)
                if magic == BLANK_MAGIC and total == seg_size - pos:
                    kind = STOP_BLANK
                    break
            if pos < 0:
                break
            rec = decode(buffer, pos, readable - pos, seg_start + pos)
            if rec is None:
                break
            if rows:
                raw_topic = rec.topic.encode("ascii")
                number = topic_ids.get(raw_topic)
                if number is None:
                    number = topic_ids[raw_topic] = len(topic_names)
                    topic_names.append(rec.topic)
                out_rows += (rec.phys, rec.total, rec.queue_id, rec.queue_offset, rec.tags_code, rec.store_ts, number)
            if keys:
                found, uniq = _property_values(rec.props_raw, keys_name, uniq_name if keys >= 2 else None)
                seed = _java_hash(f"{rec.topic}#", 0)
                try:
                    for key in found.decode("utf-8", "surrogatepass").split() if found else ():
                        out_keys += (_index_hash(_java_hash(key, seed)), rec.phys, rec.store_ts)
                except UnicodeDecodeError:
                    pass  # not UTF-8 (it was written as UTF-8): nothing to index, as the compiled kernel
                try:
                    if uniq:
                        out_keys += (_index_hash(_java_hash(uniq.decode("utf-8", "surrogatepass"), seed)), rec.phys,
                                     rec.store_ts)
                except UnicodeDecodeError:
                    pass
            count += 1
            last_ts = rec.store_ts
            pos += rec.total
        packed_rows = np.array(out_rows, dtype=np.int64).tobytes() if rows else None
        packed_keys = np.array(out_keys, dtype=np.int64).tobytes() if keys else None
        return pos, kind, count, last_ts, packed_rows, packed_keys

    @staticmethod
    def check_entries(entries: bytes, first_qoff: int, queue_id: int, log_end: int,
                      segments: Sequence[tuple[int, int, Any]]) -> bytes:
        starts = [s[0] for s in segments]
        if starts != sorted(starts):
            raise ValueError("segments must be sorted by start")
        ok = bytearray(len(entries) // _ENTRY.size)
        for i, (phys, size, tags) in enumerate(_ENTRY.iter_unpack(entries[: len(ok) * _ENTRY.size])):
            if size < HEADER_SIZE or phys < 0 or phys + size > log_end:
                continue
            which = _last_at_or_below(starts, phys)
            if which < 0:
                continue
            start, seg_size, buffer = segments[which]
            rel = phys - start
            if rel + size > min(seg_size, len(buffer)):
                continue
            head = HEAD.unpack_from(buffer, rel)
            ok[i] = (head[1] == MESSAGE_MAGIC and head[0] == size and head[4] == queue_id
                     and head[6] == first_qoff + i and head[7] == phys and head[15] == tags)
        return bytes(ok)

    @staticmethod
    def read_records(offsets: Sequence[int], segments: Sequence[tuple[int, int, int, Any]],
                     stored_type: type[StoredMessage], setters: tuple[Any, ...],
                     born_host_name: str) -> list[StoredMessage | None]:
        """``CommitLog.read`` and ``to_stored`` per offset (``stored_type``, ``setters`` and
        ``born_host_name`` are what ``to_stored`` uses already: the compiled kernel needs them)."""
        starts = _sorted_starts(segments)
        out: list[StoredMessage | None] = []
        for phys in offsets:
            rec = _record_at(segments, starts, phys)
            out.append(None if rec is None else rec.to_stored(rec.total))
        return out

    @staticmethod
    def read_run(entries: bytes, first_qoff: int, queue_id: int, topic: bytes,
                 segments: Sequence[tuple[int, int, int, Any]], stored_type: type[StoredMessage],
                 setters: tuple[Any, ...], born_host_name: str) -> list[StoredMessage] | None:
        """``read_records`` of the entries' offsets, None unless each record is exactly its entry's
        (checked before the record's properties are decoded, as the compiled kernel does)."""
        starts = _sorted_starts(segments)
        out: list[StoredMessage] = []
        whole = len(entries) - len(entries) % _ENTRY.size
        for qoff, (phys, size, tags) in enumerate(_ENTRY.iter_unpack(entries[:whole]), first_qoff):
            rec = _record_at(segments, starts, phys)
            if rec is None or (rec.total, rec.tags_code, rec.queue_id, rec.queue_offset) != (size, tags, queue_id, qoff):
                return None
            if rec.topic.encode("ascii") != topic:
                return None
            out.append(rec.to_stored(rec.total))
        return out

    @staticmethod
    def queue_entries(entries: bytes, first_qoff: int, entry_type: type[ConsumeQueueEntry],
                      setters: tuple[Any, ...]) -> list[ConsumeQueueEntry]:
        return [entry_type(i, phys, size, tags) for i, (phys, size, tags) in
                enumerate(_ENTRY.iter_unpack(entries[: len(entries) - len(entries) % _ENTRY.size]), first_qoff)]


def _sorted_starts(segments: Sequence[tuple[int, ...]]) -> list[int]:
    starts = [s[0] for s in segments]
    if starts != sorted(starts):
        raise ValueError("segments must be sorted by start")
    return starts


def _record_at(segments: Sequence[tuple[int, int, int, Any]], starts: list[int], phys: int) -> Decoded | None:
    """The sound record at commit-log offset ``phys`` of ``(start, end, limit, buffer)`` segments."""
    which = _last_at_or_below(starts, phys) if phys >= 0 else -1
    if which < 0:
        return None
    start, end, limit, buffer = segments[which]
    limit = min(limit, len(buffer))
    pos = phys - start
    return decode(buffer, pos, limit - pos, phys) if phys < end and pos < limit else None


def _last_at_or_below(starts: list[int], value: int) -> int:
    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


_COMPILED_MODULE = load_kernel(SCAN_KERNEL)


def compiled_scan_kernel() -> Any:
    """The ``_scan`` extension module, or None when it is not built for this layout."""
    return _COMPILED_MODULE


def entry_reader(kernel: ScanKernel) -> Callable[[bytes, int], list[ConsumeQueueEntry]]:
    """The kernel's ``queue_entries`` for ConsumeQueueEntry: ``(entries, first queue offset)``."""
    queue_entries = kernel.queue_entries

    def entries_of(entries: bytes, first_qoff: int) -> list[ConsumeQueueEntry]:
        return queue_entries(entries, first_qoff, ConsumeQueueEntry, ENTRY_SETTERS)

    return entries_of


def make_scan_kernel(kernel: str) -> ScanKernel:
    """The scan kernel named by the ``scan_kernel`` option ("auto": compiled when built)."""
    module = compiled_scan_kernel() if kernel in ("auto", "c") else None
    if module is not None:
        return module
    if kernel == "c":
        raise StoreError(
            "store_mmap.scan_kernel = \"c\" but the compiled scan plugmq.plugins.store_mmap._scan is not built for "
            "this layout; reinstall plugmq with a C compiler and the Python headers (pip install -e .), or use "
            "scan_kernel = \"auto\" or \"python\""
        )
    return PyScanKernel()  # "auto": plugmq.kit.native said once what falls back


# ------------------------------------------------------------------------------------------------
# scanning the log
# ------------------------------------------------------------------------------------------------


@attrs.frozen
class Damage:
    """Bytes ``[start, end)`` of the log hold no sound record but sound ones follow them."""

    start: int
    end: int


@attrs.define
class LogScan:
    """What a scan of the log found."""

    end: int  # the first unsound record nothing sound follows, or the first boundary at or past the limit
    damage: list[Damage]  # unsound stretches skipped because sound records follow them
    count: int = 0  # sound records
    last_ts: int = -1  # store time of the last one (-1: none)
    rows: np.ndarray = attrs.field(factory=lambda: np.zeros((0, ROW_FIELDS), dtype=np.int64))
    keys: np.ndarray = attrs.field(factory=lambda: np.zeros((0, 3), dtype=np.int64))  # (hash, phys, store time)
    topics: list[str] = attrs.field(factory=list)  # names of the rows' topic numbers


def next_sound(cl: CommitLog, bad: int) -> int | None:
    """The first sound record boundary after the unsound one at ``bad``: a later record in the same
    segment (found by its magic, then checked whole: offset field, sizes and both CRCs), or the
    first record of a later segment. None when nothing sound follows (``bad`` is the log's end)."""
    seg = cl.segment_for(bad)
    if seg is None:
        return None
    rel = bad - seg.start + 1
    while seg is not None:
        mm = seg.mm
        # Only stretches holding data are searched (and read): holes hold no record, and reading
        # one through a tmpfs mapping on a full file system is a SIGBUS.
        for first, last in seg.data_ranges(rel, seg.size):
            last = min(last, seg.size - END_FILE_MIN_BLANK)
            at = mm.find(_MAGIC_BYTES, max(first, rel) + _MAGIC_AT, last)
            while at >= 0:
                pos = at - _MAGIC_AT
                if pos >= first and decode(mm, pos, last - pos, seg.start + pos) is not None:
                    return seg.start + pos
                at = mm.find(_MAGIC_BYTES, at + 1, last)
        seg = cl.segment_for(seg.end)
        rel = 0
        if seg is not None:
            readable = min(seg.data_end(), seg.size - END_FILE_MIN_BLANK)
            if decode(seg.mm, 0, readable, seg.start) is not None:
                return seg.start
    return None


def scan_log(cl: CommitLog, kernel: ScanKernel, begin: int, *, limit: int | None = None, rows: bool = False,
             keys: int = 0) -> LogScan:
    """Check the records from ``begin`` (a record boundary) on, across segments; an unsound record
    followed by sound ones is damage to skip, not the end of the log. ``rows`` / ``keys`` (1: the
    KEYS property, 2: also the unique id) collect what re-dispatching the records needs."""
    ids: dict[bytes, int] = {}
    names: list[str] = []
    row_parts: list[bytes] = []
    key_parts: list[bytes] = []
    damage: list[Damage] = []
    count = 0
    last_ts = -1
    pos = begin
    stop_at = _NO_LIMIT if limit is None else limit
    while True:
        seg = cl.segment_for(pos)
        end = pos
        while seg is not None:
            readable = min(seg.data_end(), seg.size - END_FILE_MIN_BLANK)
            stop, kind, n, ts, found_rows, found_keys = kernel.scan(
                seg.mm, pos - seg.start, readable, seg.size, seg.start, min(stop_at - seg.start, _NO_LIMIT), rows,
                keys, KEYS_NAME, UNIQ_NAME, ids, names)
            count += n
            if n:
                last_ts = ts
            if found_rows:
                row_parts.append(found_rows)
            if found_keys:
                key_parts.append(found_keys)
            end = seg.start + stop
            if kind != STOP_BLANK:
                break
            end = seg.end  # the blank marker fills the segment: the log goes on in the next one, if any
            seg = cl.segment_for(end)
            pos = end
        if end >= stop_at:
            break
        resume = next_sound(cl, end)
        if resume is None or resume >= stop_at:
            break
        damage.append(Damage(end, resume))
        pos = resume
    scan = LogScan(end, damage, count, last_ts, topics=names)
    if row_parts:
        scan.rows = np.frombuffer(b"".join(row_parts), dtype=np.int64).reshape(-1, ROW_FIELDS)
    if key_parts:
        scan.keys = np.frombuffer(b"".join(key_parts), dtype=np.int64).reshape(-1, 3)
    return scan
