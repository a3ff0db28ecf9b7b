"""Conformance clauses of the ReplicableStore half of the storage contract (log shipping).

Mixed into :class:`plugmq.conformance.storage.StoreConformance`, so every storage plugin runs
them; a plugin without the ``replication`` capability skips them. Each clause opens a master
store and a slave store of the plugin under test (same options, different store hosts) and ships
the master's log chunk by chunk, as the replication plugin does over the network (the chunk's
bytes are copied, never shared).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugmq.conformance._store_support import Opener, require
from plugmq.core import (
    AppendRequest,
    AppendResult,
    LogChunk,
    ManualClock,
    MessageStore,
    Prop,
    ReplicableStore,
    StoreError,
)

__all__ = ["ReplicationClauses", "assert_same_store", "ship"]

MASTER_HOST = "10.1.2.3:10911"
SLAVE_HOST = "10.7.7.7:10911"
TOPICS = ("ReplTopicA", "ReplTopicB")


def ship(master: ReplicableStore, slave: ReplicableStore, *, max_bytes: int = 512, until: int | None = None) -> int:
    """Copy the master's log to the slave from the slave's end, chunk by chunk; how many chunks."""
    end = master.log_end_offset() if until is None else until
    position = slave.log_end_offset()
    chunks = 0
    while position < end:
        chunk = master.read_log(position, min(max_bytes, end - position))  # never past ``until``
        assert chunk.start >= position and chunk.data, f"read_log({position}) returned no record before the end {end}"
        position = slave.append_log(LogChunk(chunk.start, bytes(chunk.data), chunk.records))
        assert position == chunk.end, f"append_log returned {position}, the chunk ends at {chunk.end}"
        chunks += 1
    return chunks


def _request(i: int, topic: str, queue_id: int, body: bytes | None = None) -> AppendRequest:
    props = {Prop.KEYS: f"key{i} shared", Prop.UNIQ_KEY: f"UNIQ{i:06d}", Prop.TAGS: f"tag{i % 3}", "user": "\u00e9"}
    return AppendRequest(topic=topic, queue_id=queue_id, body=f"message-{i}".encode() if body is None else body,
                         properties=props, tags_code=i * 7, born_timestamp_ms=1_700_000_000_000 + i,
                         born_host="192.168.1.9:4321", reconsume_times=i % 2)


def fill(store: MessageStore, clock: ManualClock, count: int, *, first: int = 0) -> list[AppendResult]:
    """Singles and batches over two topics and three queues, with the clock moving."""
    results: list[AppendResult] = []
    i = first
    while i < first + count:
        if i % 5 == 4:
            batch = [_request(j, TOPICS[j % 2], 1) for j in range(i, min(i + 3, first + count))]
            results += store.append_batch(batch)
            i += len(batch)
        else:
            results.append(store.append(_request(i, TOPICS[i % 2], i % 3, b"" if i % 11 == 0 else None)))
            i += 1
        clock.advance(3)
    return results


def assert_same_store(master: MessageStore, slave: MessageStore, results: list[AppendResult]) -> None:
    """Every message, queue, id, key and time answer of the master is the slave's."""
    for res in results:
        got = master.read(res.commit_log_offset)
        assert got is not None
        assert slave.read(res.commit_log_offset) == got, f"message at {res.commit_log_offset} differs on the slave"
        assert slave.query_by_id(res.msg_id) == got, f"slave does not find {res.msg_id} (the master's id)"
    assert dict(slave.queues()) == dict(master.queues())
    for topic, count in master.queues().items():
        for queue_id in range(count):
            low, high = master.min_offset(topic, queue_id), master.max_offset(topic, queue_id)
            assert (slave.min_offset(topic, queue_id), slave.max_offset(topic, queue_id)) == (low, high)
            assert slave.read_queue(topic, queue_id, low, 10_000) == master.read_queue(topic, queue_id, low, 10_000)
    stamps = sorted({m.store_timestamp_ms for r in results if (m := master.read(r.commit_log_offset))})
    for topic in TOPICS:
        for key in ("shared", "key4", "UNIQ000007"):
            ids = [m.msg_id for m in master.query_by_key(topic, key, max_results=1000)]
            assert sorted(m.msg_id for m in slave.query_by_key(topic, key, max_results=1000)) == sorted(ids)
        for stamp in stamps[:: max(1, len(stamps) // 7)]:
            for queue_id in range(3):
                assert slave.offset_for_timestamp(topic, queue_id, stamp) == master.offset_for_timestamp(
                    topic, queue_id, stamp)


class ReplicationClauses:
    """The ReplicableStore clauses; StoreConformance provides ``store_plugin``, ``clock`` and ``opener``."""

    @pytest.fixture
    def pair(self, store_plugin: object, tmp_path: Path, clock: ManualClock) -> Iterator[_Pair]:

        require(store_plugin, "replication")  # type: ignore[arg-type]
        pair = _Pair(store_plugin, tmp_path, clock)
        yield pair
        pair.close()

    def test_replicated_log_is_identical(self, pair: _Pair, clock: ManualClock) -> None:
        """Shipping the log chunk by chunk gives the slave the same messages at the same offsets, ids and
        times, with every query answering alike."""
        master, slave = pair.master(), pair.slave()
        assert isinstance(master, ReplicableStore), "a store declaring replication must be a ReplicableStore"
        assert master.log_format == slave.log_format and master.log_format
        assert slave.log_end_offset() == 0 and slave.read_log(0, 100).data == b""
        results = fill(master, clock, 40)
        # Large records make a segmented log roll over; the chunks then carry the segment's end.
        results += [master.append(_request(900 + i, TOPICS[0], 2, os.urandom(2_600_000))) for i in range(4)]
        results += fill(master, clock, 10, first=100)
        assert ship(master, slave, max_bytes=700) > 10
        assert slave.log_end_offset() == master.log_end_offset()
        assert slave.read_log(slave.log_end_offset(), 1000).data == b""
        assert_same_store(master, slave, results)

    def test_replicated_log_survives_reopen(self, pair: _Pair, clock: ManualClock) -> None:
        """A slave built from shipped chunks answers the same after it is closed and reopened."""
        master, slave = pair.master(), pair.slave()
        results = fill(master, clock, 30)
        ship(master, slave)
        slave = pair.reopen_slave()
        assert slave.log_end_offset() == master.log_end_offset()
        results += fill(master, clock, 30, first=30)
        ship(master, slave, max_bytes=4096)
        slave = pair.reopen_slave()
        assert_same_store(master, slave, results)

    def test_torn_or_misplaced_chunk_refused_whole(self, pair: _Pair, clock: ManualClock) -> None:
        """A chunk that is torn, damaged, misplaced or of another format is refused whole; the slave is
        unchanged and usable."""
        master, slave = pair.master(), pair.slave()
        results = fill(master, clock, 12)
        whole = master.read_log(0, 1 << 20)
        assert whole.start == 0 and whole.end == master.log_end_offset() and whole.records == 12
        damaged = bytearray(whole.data)
        damaged[len(damaged) // 2] ^= 0x5A
        for bad in (LogChunk(0, whole.data[:-7], 12), LogChunk(0, bytes(damaged), 12),
                    LogChunk(0, whole.data[:40], 1)):
            with pytest.raises(StoreError):
                slave.append_log(bad)
            assert slave.log_end_offset() == 0 and not dict(slave.queues()), "a refused chunk left something behind"
        half = results[5].commit_log_offset
        ship(master, slave, until=half)
        with pytest.raises(StoreError):  # starts before the slave's end: records it already holds
            slave.append_log(master.read_log(results[2].commit_log_offset, 1 << 20))
        assert slave.log_end_offset() == half
        ship(master, slave)
        assert_same_store(master, slave, results)

    def test_truncate_then_resume(self, pair: _Pair, clock: ManualClock) -> None:
        """truncate_log cuts every record at or after an offset with its queue and index entries; appends
        continue there."""
        master, slave = pair.master(), pair.slave()
        results = fill(master, clock, 30)
        ship(master, slave)
        cut = results[17]
        with pytest.raises(StoreError):
            slave.truncate_log(cut.commit_log_offset + 1)  # inside a record
        assert slave.log_end_offset() == master.log_end_offset()
        assert slave.truncate_log(cut.commit_log_offset) == 13
        assert slave.log_end_offset() == cut.commit_log_offset
        assert slave.read(cut.commit_log_offset) is None and slave.read(results[-1].commit_log_offset) is None
        for res in results[17:]:
            assert slave.query_by_id(res.msg_id) is None
        expected = {(m.topic, m.queue_id): m.queue_offset + 1 for r in results[:17] if (m := master.read(r.commit_log_offset))}
        for (topic, queue_id), high in expected.items():
            assert slave.max_offset(topic, queue_id) == high
        assert not any(m.commit_log_offset >= cut.commit_log_offset
                       for m in slave.query_by_key(TOPICS[0], "shared", max_results=1000))
        slave = pair.reopen_slave()
        assert slave.log_end_offset() == cut.commit_log_offset
        ship(master, slave)
        assert_same_store(master, slave, results)
        # Cut again, then appends continue locally at the cut (a promoted slave that was cut back).
        cut = results[25]
        slave.truncate_log(cut.commit_log_offset)
        message = master.read(cut.commit_log_offset)
        assert message is not None
        again = slave.append(_request(25, message.topic, message.queue_id))
        assert (again.commit_log_offset, again.queue_offset) == (cut.commit_log_offset, message.queue_offset)

    def test_empty_store_adopts_the_master_start(self, pair: _Pair, clock: ManualClock) -> None:
        """An empty store takes a first chunk that starts anywhere, its queues starting at the offsets the
        records carry."""
        master, slave = pair.master(), pair.slave()
        results = fill(master, clock, 30)
        start = results[12].commit_log_offset  # as if retention had removed everything before it
        position = start
        while position < master.log_end_offset():
            chunk = master.read_log(position, 600)
            position = slave.append_log(LogChunk(chunk.start, bytes(chunk.data), chunk.records))
        assert (slave.log_min_offset(), slave.log_end_offset()) == (start, master.log_end_offset())
        for attempt in range(2):
            for res in results:
                want = master.read(res.commit_log_offset) if res.commit_log_offset >= start else None
                assert slave.read(res.commit_log_offset) == want
            for topic, count in slave.queues().items():
                for queue_id in range(count):
                    held = [master.read(r.commit_log_offset) for r in results[12:]]
                    offsets = [m.queue_offset for m in held if m and (m.topic, m.queue_id) == (topic, queue_id)]
                    if not offsets:
                        continue
                    assert slave.min_offset(topic, queue_id) == offsets[0]
                    assert slave.max_offset(topic, queue_id) == master.max_offset(topic, queue_id)
                    assert slave.read_queue(topic, queue_id, 0, 100) == master.read_queue(topic, queue_id, offsets[0], 100)
            if attempt == 0:
                slave = pair.reopen_slave()
        results += fill(master, clock, 5, first=30)
        ship(master, slave)
        assert slave.read(results[-1].commit_log_offset) == master.read(results[-1].commit_log_offset)

    def test_log_listener_hears_every_append(self, pair: _Pair, clock: ManualClock) -> None:
        """The log listener hears the new end offset of every append, local or replicated."""
        master, slave = pair.master(), pair.slave()
        heard: list[int] = []
        master.set_log_listener(heard.append)
        ends = []
        for i in range(8):
            if i % 3 == 2:
                last = master.append_batch([_request(i * 10 + j, TOPICS[j % 2], j) for j in range(3)])[-1]
            else:
                last = master.append(_request(i, TOPICS[0], 0))
            ends.append(last.commit_log_offset + last.size)
        assert heard == ends and heard[-1] == master.log_end_offset()
        master.set_log_listener(None)
        fill(master, clock, 3, first=12)
        assert heard[-1] == ends[-1], "a removed listener was still called"
        on_slave: list[int] = []
        slave.set_log_listener(on_slave.append)
        ship(master, slave, max_bytes=1 << 20)
        assert on_slave == [master.log_end_offset()]


class _Pair:
    """A master and a slave store of the plugin under test, closed at teardown."""

    def __init__(self, sut: object, root: Path, clock: ManualClock) -> None:

        self._master = Opener(sut, root / "master", clock)  # type: ignore[arg-type]
        self._slave = Opener(sut, root / "slave", clock, store_host=SLAVE_HOST)  # type: ignore[arg-type]
        self._current_slave: ReplicableStore | None = None

    def master(self) -> ReplicableStore:
        return _replicable(self._master())

    def slave(self) -> ReplicableStore:
        self._current_slave = _replicable(self._slave())
        return self._current_slave

    def reopen_slave(self) -> ReplicableStore:
        assert self._current_slave is not None
        self._current_slave.close()
        return self.slave()

    def close(self) -> None:
        self._master.close_all()
        self._slave.close_all()


def _replicable(store: MessageStore) -> ReplicableStore:
    assert isinstance(store, ReplicableStore), f"{type(store).__name__} declares replication but lacks its methods"
    return store
