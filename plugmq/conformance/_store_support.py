"""What the storage clauses share: the store under test, opening stores, requests and checks.

Private to ``plugmq.conformance``; ``plugmq.conformance.storage`` exports the public names
(``StoreUnderTest``, ``flip_newest_body``, ``assert_stored``). The parent side of the kill clause
lives here too: it starts ``_storage_child``, SIGKILLs it and checks what survived.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import pytest

from plugmq.broker.components import open_store, plugin_declaration
from plugmq.conformance import _storage_child as child
from plugmq.conformance._children import run_until_killed
from plugmq.core import (
    AppendRequest,
    AppendResult,
    ConsumeQueueEntry,
    ManualClock,
    MessageStore,
    Prop,
    StoreCapabilities,
    StoredMessage,
)
from plugmq.core.contracts import BulkReading, Family
from plugmq.core.retention import RetentionFloor

__all__ = [
    "STORE_HOST",
    "TOPIC",
    "Opener",
    "StoreUnderTest",
    "assert_bulk_reads_as_read",
    "assert_stored",
    "capabilities_of",
    "check_after_kill",
    "flip_newest_body",
    "read_present",
    "request",
    "require",
    "run_and_kill",
    "write_concurrently",
]

STORE_HOST = "10.1.2.3:10911"
TOPIC = "ConformanceTopic"


@attrs.frozen
class StoreUnderTest:
    """What the suite needs to open the store under test.

    ``options``: the plugin's option table (what ``[plugins.<name>]`` would hold), e.g. sync or
    async flush and small segment sizes. ``corrupt_tail(data_dir)``: damages the newest record(s)
    of a closed store under ``data_dir`` in the store's own file format; None skips that clause.
    ``acks_survive_kill``: an append that returned survives a SIGKILL of the writing process
    with these options (True for sync flush, and for async stores that write through the OS page
    cache; False e.g. for a store buffering in user space). When False the kill clause still
    checks that nothing corrupt is returned and the store reopens.
    """

    plugin: str
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)))
    corrupt_tail: Callable[[Path], None] | None = None
    acks_survive_kill: bool = True


def flip_newest_body(plugin: str, options: Mapping[str, Any] | None = None) -> Callable[[Path], None]:
    """A ``corrupt_tail`` hook for stores that keep message bodies verbatim in their files.

    It opens the store, finds the newest message (largest commit-log offset at the queues'
    heads), closes it, then flips one byte inside every copy of that body in every file under
    ``data_dir``. Knows no file format; fails loudly if the body is not found (compressed or
    encrypted stores need their own hook).
    """

    def corrupt(data_dir: Path) -> None:
        store = open_store(plugin, data_dir, options=dict(options or {}), store_host=STORE_HOST)
        try:
            heads = [entry for topic, count in store.queues().items() for qid in range(count)
                     for entry in store.read_queue(topic, qid, max(store.max_offset(topic, qid) - 1, 0), 1)]
            newest = store.read(max(heads, key=lambda e: e.commit_log_offset).commit_log_offset)
        finally:
            store.close()
        assert newest is not None and len(newest.body) >= 16, "the newest message needs a body of 16+ bytes"
        hits = 0
        for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
            data = bytearray(path.read_bytes())
            found = 0
            pos = data.find(newest.body)
            while pos >= 0:
                data[pos + len(newest.body) // 2] ^= 0x5A
                found += 1
                pos = data.find(newest.body, pos + 1)
            if found:
                path.write_bytes(bytes(data))
                hits += found
        assert hits, f"the newest body was not found verbatim under {data_dir}; give {plugin} its own hook"

    return corrupt


@functools.cache
def capabilities_of(plugin: str) -> StoreCapabilities:
    declaration = plugin_declaration(plugin)
    assert Family.STORAGE in declaration.families, f"{plugin} does not declare the storage family"
    caps = declaration.capabilities
    assert isinstance(caps, StoreCapabilities), (
        f"{plugin} must declare StoreCapabilities as its capabilities, got {type(caps).__name__}"
    )
    return caps


def require(sut: StoreUnderTest, capability: str) -> None:
    """Skip, saying so, unless the store declares ``capability`` (a StoreCapabilities field)."""
    declared = attrs.asdict(capabilities_of(sut.plugin))
    if capability not in declared:
        raise ValueError(f"{capability!r} is not a StoreCapabilities field: {', '.join(declared)}")
    if not declared[capability]:
        pytest.skip(f"{sut.plugin} does not declare {capability}")


def request(topic: str = TOPIC, queue_id: int = 0, body: bytes = b"body", *, keys: str | None = None,
            uniq: str | None = None, tags: str | None = None, **fields: Any) -> AppendRequest:
    props: dict[str, str] = {"user": "value", "unicode": "\u00e9\u4e2d"}
    if keys:
        props[Prop.KEYS] = keys
    if uniq:
        props[Prop.UNIQ_KEY] = uniq
    if tags:
        props[Prop.TAGS] = tags
    return AppendRequest(topic=topic, queue_id=queue_id, body=body, properties=props, **fields)


def assert_stored(got: StoredMessage | None, req: AppendRequest, res: AppendResult, store_host: str = STORE_HOST) -> None:
    """``got`` is exactly the message ``req`` stored as ``res`` said."""
    assert got is not None, f"message at commit-log offset {res.commit_log_offset} not found"
    assert (got.topic, got.queue_id, got.queue_offset) == (req.topic, req.queue_id, res.queue_offset)
    assert got.body == req.body, f"body differs at commit-log offset {res.commit_log_offset}"
    assert dict(got.properties) == dict(req.properties)
    assert got.commit_log_offset == res.commit_log_offset and got.size == res.size
    assert got.store_timestamp_ms == res.store_timestamp_ms
    assert (got.tags_code, got.born_timestamp_ms, got.born_host) == (req.tags_code, req.born_timestamp_ms, req.born_host)
    assert (got.reconsume_times, got.sys_flag, got.prepared_transaction_offset) == (
        req.reconsume_times, req.sys_flag, req.prepared_transaction_offset)
    assert got.store_host == store_host and got.msg_id == res.msg_id


def assert_bulk_reads_as_read(store: MessageStore, offsets: list[int]) -> None:
    """A store declaring BulkReading answers ``read_many`` as ``read`` answers each entry (entries of
    sizes the log may not hold, in the order given); nothing to check for other stores."""
    if not isinstance(store, BulkReading):
        return
    entries = [ConsumeQueueEntry(i, offset, 120, 0) for i, offset in enumerate(offsets)]
    one_by_one = [store.read(e.commit_log_offset, e.size) for e in entries]
    assert store.read_many(entries) == one_by_one, "read_many answered other than read one entry at a time"


def read_present(store: MessageStore, commit_log_offset: int) -> StoredMessage:
    """The message at ``commit_log_offset``, which the clause knows is there."""
    got = store.read(commit_log_offset)
    assert got is not None, f"message at commit-log offset {commit_log_offset} not found"
    return got


class Opener:
    """Opens stores of one plugin in one directory; closes whatever is still open at teardown."""

    def __init__(self, sut: StoreUnderTest, data_dir: Path, clock: ManualClock, *, store_host: str = STORE_HOST) -> None:
        self.sut = sut
        self.data_dir = data_dir
        self.clock = clock
        self.store_host = store_host
        self.opened: list[MessageStore] = []
        self.floor = RetentionFloor()  # what a broker passes as context.retention; holds nothing by default

    def __call__(self) -> MessageStore:
        store = open_store(self.sut.plugin, self.data_dir, clock=self.clock, options=dict(self.sut.options),
                           store_host=self.store_host, retention=self.floor)
        self.opened.append(store)
        return store

    def reopen(self, store: MessageStore) -> MessageStore:
        store.close()
        return self()

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


# ---------------------------------------------------------------------------------------------
# the kill clause's parent side
# ---------------------------------------------------------------------------------------------


def run_and_kill(sut: StoreUnderTest, data_dir: Path, options_file: Path, *, first: int,
                  acks: int) -> dict[int, tuple[int, int, int]]:
    """Start the writer, SIGKILL it after ``acks`` acknowledgements; return index -> (qid, qoff, clo)."""
    received = run_until_killed(
        "plugmq.conformance._storage_child", [sut.plugin, str(data_dir), str(options_file), str(first)],
        options_file.with_name(f"writer-{first}.log"), lambda out: out.count(b"\n") >= acks)
    acked = {}
    for line in received.split(b"\n")[:-1]:  # a last line without newline was cut by the kill
        index, qoff, clo, qid = map(int, line.split())
        acked[index] = (qid, qoff, clo)
    return acked


def check_after_kill(store: MessageStore, acked: Mapping[int, tuple[int, int, int]]) -> None:
    for index, (qid, qoff, clo) in acked.items():
        got = store.read(clo)
        assert got is not None, f"acknowledged message {index} (commit-log offset {clo}) lost after the kill"
        assert (got.topic, got.queue_id, got.queue_offset) == (child.TOPIC, qid, qoff)
        assert child.index_of(got.body) == index, f"acknowledged message {index} came back altered"
    indexes_seen = set()
    for qid in range(child.QUEUES):
        low, high = store.min_offset(child.TOPIC, qid), store.max_offset(child.TOPIC, qid)
        entries = store.read_queue(child.TOPIC, qid, low, 1_000_000)
        assert [e.queue_offset for e in entries] == list(range(low, high)), f"queue {qid} has holes after the kill"
        for entry in entries:
            got = store.read(entry.commit_log_offset)
            assert got is not None, f"queue {qid} entry {entry.queue_offset} points at no record after the kill"
            found = child.index_of(got.body)
            assert found is not None, f"a damaged record came back at commit-log offset {entry.commit_log_offset}"
            assert got.queue_offset == entry.queue_offset and got.queue_id == qid
            indexes_seen.add(found)
    assert set(acked) <= indexes_seen, "acknowledged messages missing from their consume queues"
    before = store.max_offset("AfterCrash", 0)  # another topic: the writer's queues stay its own
    res = store.append(AppendRequest("AfterCrash", 0, b"after the crash"))
    assert res.queue_offset == before
    assert read_present(store, res.commit_log_offset).body == b"after the crash"



def write_concurrently(store: MessageStore, *, threads: int, rounds: int
                       ) -> tuple[list[list[tuple[AppendRequest, AppendResult]]], list[list[AppendResult]]]:
    """``threads`` writers started together, each ``rounds`` appends to queues 0 and 1 (every third
    a batch of three). Per writer its (request, result) pairs in order; and every batch's results.
    A writer's exception fails the caller."""
    results: list[list[tuple[AppendRequest, AppendResult]]] = [[] for _ in range(threads)]
    batches: list[list[AppendResult]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        try:
            start.wait()
            for i in range(rounds):
                queue_id = (t + i) % 2
                if i % 3 == 0:
                    reqs = [request(queue_id=queue_id, body=f"t{t}-{i}-{k}".encode()) for k in range(3)]
                    got = store.append_batch(reqs)
                    batches.append(got)
                    results[t] += zip(reqs, got)
                else:
                    req = request(queue_id=queue_id, body=f"t{t}-{i}".encode())
                    results[t].append((req, store.append(req)))
        except BaseException as exc:  # noqa: BLE001 - surfaced below: a thread's failure must fail the test
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, f"a writer raised: {errors!r}"
    return results, batches
