"""Log shipping for the key-value stores (the ReplicableStore half of the storage contract).

The log is the ``msg`` family: records keyed by their commit-log offset, each the size of its
value, so a run of records is the concatenation of their values and a slave rebuilds them key by
key. A chunk is checked record by record (the codec's CRCs, each record's own offset) before one
atomic engine write puts records, consume-queue entries, index entries, queue state and store
state, exactly as a group of appends does. store_lmdb and store_rocks share the codec, so their
chunks have one format and either can be the other's slave.

Offsets are never reused after a crash cut the tail (see ``base``), so a log may have holes:
``read_log`` skips them (a chunk may start after the offset asked for) and ``append_log`` takes
a chunk that starts at or after the end of the records held.
"""

from __future__ import annotations

import struct
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

from plugmq.core.contracts import LogChunk
from plugmq.core.errors import CorruptRecordError, StoreError
from plugmq.core.message import StoredMessage
from plugmq.core.names import validate_topic
from plugmq.kit.kvstore import codec
from plugmq.kit.kvstore.engine import STATE_KEY, WriteSet
from plugmq.kit.kvstore.groupcommit import GroupCommit

if TYPE_CHECKING:
    from plugmq.kit.kvstore.engine import KVReader

__all__ = ["LOG_FORMAT", "KeyValueReplicaLog"]

#: One format for store_lmdb and store_rocks: the record codec's.
LOG_FORMAT = "kvstore-record/1"

_TOTAL = struct.Struct(">I")


class KeyValueReplicaLog:
    """Mixed into KeyValueMessageStore: the attributes below are the store's own."""

    NAME: ClassVar[str]
    _commit: GroupCommit[Any, Any]
    _queues: dict[bytes, list[int]]
    _next_offset: int
    _last_ts: int
    _closed: bool
    _stats: dict[str, float]
    _log: Any
    _log_end: int | None = None  # end of the records held (None: ask the engine)
    _log_listener: Callable[[int], None] | None = None

    @abstractmethod
    def _reading(self) -> AbstractContextManager[KVReader]:
        """The engine's read view (:class:`KVReader`)."""

    @abstractmethod
    def _write_appends(
        self, msg: list[tuple[bytes, bytes]], cq: list[tuple[bytes, bytes]], idx: list[tuple[bytes, bytes]],
        queues: list[tuple[bytes, bytes]], state: bytes,
    ) -> None:
        """Write one group of appends atomically (``state`` goes under STATE_KEY in meta)."""

    @abstractmethod
    def _write_tail_cut(self, changes: WriteSet) -> None:
        """Write ``changes`` atomically and durably (it repairs the store at open)."""

    @abstractmethod
    def _truncate(self, cut: int) -> None:
        """The store's tail cut: records at or after ``cut`` with their queue and index entries."""

    @abstractmethod
    def _check_open(self) -> None:
        """The store's: StoreError once closed."""

    # -- what a slave must share with its master ----------------------------------------------

    @property
    def log_format(self) -> str:
        return LOG_FORMAT

    def log_end_offset(self) -> int:
        end = self._log_end
        if end is None:
            with self._reading() as reader:
                last = reader.last("msg")
            end = codec.OFFSET.unpack(last[0])[0] + len(last[1]) if last else self._next_offset
            self._log_end = end
        return end

    def log_min_offset(self) -> int:
        with self._reading() as reader:
            for key, _raw in reader.scan("msg"):
                return int(codec.OFFSET.unpack(key)[0])
        return self.log_end_offset()

    def set_log_listener(self, listener: Callable[[int], None] | None) -> None:
        self._log_listener = listener

    # -- master side --------------------------------------------------------------------------

    @staticmethod
    def _inside_a_record(reader: KVReader, offset: int) -> bool:
        for key in reader.keys_back("msg", codec.OFFSET.pack(offset)):
            start = codec.OFFSET.unpack(key)[0]
            if start == offset:
                return False
            raw = reader.get("msg", key)
            return raw is not None and start + len(raw) > offset
        return False

    def read_log(self, offset: int, max_bytes: int) -> LogChunk:
        self._check_open()
        end = self.log_end_offset()
        if offset >= end:
            if offset > end:
                raise StoreError(f"log offset {offset} is past the end of the records held ({end})")
            return LogChunk(offset, b"", 0)
        parts: list[bytes] = []
        start = expect = -1
        size = 0
        with self._reading() as reader:
            if self._inside_a_record(reader, offset):
                raise StoreError(f"commit-log offset {offset} is inside a record; replication must start at a "
                                 "record boundary")
            for key, raw in reader.scan("msg", codec.OFFSET.pack(max(offset, 0))):
                at = codec.OFFSET.unpack(key)[0]
                if at >= end or (parts and (at != expect or size + len(raw) > max_bytes)):
                    break  # the end, a hole (the next chunk starts after it), or enough
                if not parts:
                    start = at
                parts.append(bytes(raw))
                size += len(raw)
                expect = at + len(raw)
        if not parts:
            return LogChunk(offset, b"", 0)
        return LogChunk(start, b"".join(parts), len(parts))

    # -- slave side ---------------------------------------------------------------------------

    @staticmethod
    def _parse(chunk: LogChunk) -> list[tuple[StoredMessage, bytes]]:
        data = chunk.data
        out: list[tuple[StoredMessage, bytes]] = []
        pos = 0
        while pos < len(data):
            at = chunk.start + pos
            if len(data) - pos < codec.HEADER.size:
                raise CorruptRecordError(f"replicated record at commit-log offset {at} is torn (a partial header)")
            total = _TOTAL.unpack_from(data, pos)[0]
            if total < codec.HEADER.size or pos + total > len(data):
                raise CorruptRecordError(f"replicated record at commit-log offset {at} is torn or damaged "
                                         f"(says {total} bytes, {len(data) - pos} arrived)")
            raw = data[pos:pos + total]
            message = codec.decode_record(raw)  # CorruptRecordError for any failed check
            if message.commit_log_offset != at:
                raise CorruptRecordError(f"replicated record at {at} says it belongs at {message.commit_log_offset}")
            validate_topic(message.topic)
            out.append((message, raw))
            pos += total
        return out

    def append_log(self, chunk: LogChunk) -> int:
        self._check_open()
        if not chunk.data:
            return self.log_end_offset()
        records = self._parse(chunk)  # every record checked before anything is written
        with self._commit.exclusive():
            end = self.log_end_offset()
            if chunk.start < end:
                raise StoreError(f"replicated chunk starts at {chunk.start} but this log holds records up to {end}; "
                                 "a slave takes the master's log only from its own end")
            msg: list[tuple[bytes, bytes]] = []
            cq: list[tuple[bytes, bytes]] = []
            idx: list[tuple[bytes, bytes]] = []
            bounds: dict[bytes, list[int]] = {}
            last_ts = self._last_ts
            for message, raw in records:
                qkey = codec.queue_prefix(message.topic, message.queue_id)
                bound = bounds.get(qkey)
                if bound is None:
                    state = self._queues.get(qkey)
                    if state is None or state[1] <= state[0]:
                        # A queue without readable entries may start anywhere: its earlier messages are
                        # older than this slave's log (a slave that started at the master's oldest record).
                        bound = bounds[qkey] = [message.queue_offset, message.queue_offset]
                    else:
                        bound = bounds[qkey] = [state[0], state[1]]
                if message.queue_offset != bound[1]:
                    raise CorruptRecordError(
                        f"replicated record at {message.commit_log_offset} has queue offset {message.queue_offset} in "
                        f"{message.topic}/{message.queue_id}, but the slave's queue continues at {bound[1]}; the "
                        "slave's store does not hold the master's log (remove its data to copy the master afresh)")
                bound[1] += 1
                offset = message.commit_log_offset
                msg.append((codec.OFFSET.pack(offset), raw))
                cq.append((codec.cq_key(qkey, message.queue_offset),
                           codec.CQ_ENTRY.pack(offset, message.size, message.tags_code)))
                idx.extend((key, b"") for key in codec.index_keys_of(message))
                last_ts = max(last_ts, message.store_timestamp_ms)
            queues = [(qkey, codec.QUEUE_STATE.pack(*bound)) for qkey, bound in bounds.items()]
            new_end = chunk.end
            self._write_appends(msg, cq, idx, queues, codec.STORE_STATE.pack(max(new_end, self._next_offset), last_ts))
            for qkey, bound in bounds.items():
                self._queues[qkey] = bound
            self._next_offset = max(new_end, self._next_offset)
            self._log_end = new_end
            self._last_ts = last_ts
            self._stats["messages"] += len(records)
            self._stats["bytes"] += len(chunk.data)
        listener = self._log_listener
        if listener is not None:
            listener(new_end)
        return new_end

    # -- cutting back -------------------------------------------------------------------------

    def truncate_log(self, offset: int) -> int:
        self._check_open()

        with self._commit.exclusive():
            if offset >= self.log_end_offset():
                return 0
            with self._reading() as reader:
                if self._inside_a_record(reader, offset):
                    raise StoreError(f"commit-log offset {offset} is inside a record; cut only at a record boundary")
                doomed = sum(1 for _ in _keys_from(reader, offset))
            self._truncate(offset)
            changes = WriteSet()
            changes.put("meta", STATE_KEY, codec.STORE_STATE.pack(offset, self._last_ts))
            self._write_tail_cut(changes)
            self._next_offset = offset
            self._log_end = None
        self._log.warning("log cut back for replication", cut_offset=offset, records=doomed)
        return doomed


def _keys_from(reader: KVReader, offset: int) -> Iterator[bytes]:
    for key, _raw in reader.scan("msg", codec.OFFSET.pack(max(offset, 0))):
        yield key
