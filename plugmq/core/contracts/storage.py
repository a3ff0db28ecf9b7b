"""Storage family: the message store every broker has exactly one of (``plugmq_make_store``).

:class:`MessageStore` is the contract, :class:`StoreCapabilities` what a store declares beyond it.
Optional features are small Protocols the broker checks with ``isinstance``:
:class:`LogPositioned` (a byte-offset commit log), :class:`ReplicableStore` (ships its log to
slaves; the ``replication`` capability), :class:`QueuePreparing` (makes a queue's files ahead of
its writes), :class:`QueueRepairing` (rebuilds damaged consume-queue entries from its log),
:class:`BulkReading` (reads a run of records in one call), :class:`QueueRunReading` (reads a
run of a queue's messages, entries and records, in one call), :class:`ColumnAppending` (answers a
batch append with its results as columns), :class:`DirectAppending` (hands a compiled caller its
plain single append) and :class:`RecoveryReporting` (says what opening it
found). :func:`read_entries` reads consume-queue entries through whichever a store has;
:func:`has_capability` is ``isinstance`` answered once per class, for per-message paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

import attrs

from plugmq.core.appendcolumns import AppendColumns
from plugmq.core.contracts._checks import non_negative_int
from plugmq.core.errors import ValidationError
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    ConsumeQueueEntry,
    StoredMessage,
)

__all__ = [
    "BulkReading",
    "ColumnAppending",
    "DirectAppending",
    "FlushMode",
    "LogChunk",
    "LogListener",
    "LogPositioned",
    "MessageStore",
    "QueuePreparing",
    "QueueRepairing",
    "QueueRunReading",
    "RecoveryFigures",
    "RecoveryReporting",
    "ReplicableStore",
    "StoreCapabilities",
    "has_capability",
    "read_entries",
]


@attrs.frozen
class StoreCapabilities:
    """What a store supports beyond the core contract (each False turns clauses into skips)."""

    sync_flush: bool = True
    async_flush: bool = True
    query_by_key: bool = True
    query_by_time: bool = True
    crash_recovery: bool = True
    retention: bool = True
    concurrent_writers: bool = True
    # The store is a ReplicableStore: it ships its commit log to slaves and takes shipped logs.
    replication: bool = False


@runtime_checkable
class MessageStore(Protocol):
    """A commit log with per-queue consume queues and indexes (RocketMQ's DefaultMessageStore).

    The rules below are what ``plugmq.conformance.storage`` checks, clause by clause (clause
    names in brackets); a store that keeps them passes it.

    Opening (``plugmq_make_store``), every time, also after a crash [restart_after_kill_mid_write,
    corrupted_tail_never_returned]:
      - Recover what was stored: every append that returned before a clean ``close`` — and, with
        the ``crash_recovery`` capability, before a SIGKILL of the process (given the flush mode
        makes it survive one) — reads back exactly as it was acknowledged.
      - Verify the tail: a record that fails its integrity check (torn by a crash, damaged on
        disk) is cut at open **together with everything stored after it**, and the consume-queue
        entries and index entries of everything cut are removed with it. Never hand out a damaged
        record, never keep an entry that points at nothing or at a damaged record, never leave a
        hole in a queue. Damage must be noticed: a store that reads a damaged record back as
        valid fails. After the cut, appends continue at the new max offset of each queue.
      - Pick up the clock (``context.clock``; store timestamps come from it), the store host
        (message ids) and the plugin's options; keep files under ``context.plugin_dir(name)``.

    Names: re-check every topic name against the name rule (``plugmq.core.names``) before it
    touches the file system, although ``AppendRequest`` already validated it — a request can be
    built around validation. A bad name is refused with ValidationError (InvalidNameError) or
    StoreError; nothing is written, no file or directory is created, and in a batch the valid
    requests are not written either [badly_named_topic_rejected].

    Appends [single_append_round_trip, batch_append_round_trip, empty_and_max_size_bodies,
    queue_offsets_dense_and_monotonic, oversize_record_refused_and_store_usable]:
      - ``queue_offset`` is the dense 0-based index of a message in its (topic, queue): no gaps,
        no repeats. ``commit_log_offset`` is a store-wide position that grows with every append
        and, with the store host, forms the message id (``encode_msg_id``; one read finds it).
      - The stored message is exactly the request (topic, queue, body bytes, every property,
        tags code, born timestamp and host, reconsume times, sys flag, prepared transaction
        offset) plus the assigned offsets, size, store timestamp (``clock.now_ms()``), store host
        and msg_id; bodies from empty to ``DEFAULT_MAX_BODY_SIZE`` bytes.
      - A body above the limit is refused (MessageTooLargeError or StoreError); a refused append
        or batch writes nothing at all and the store stays usable.

    Reads [read_queue_paging, min_max_offsets_and_queues, query_by_id_and_unknown_ids]: see the
    methods. A read of a position that holds no message returns None, never raises.

    Threads [readers_never_see_past_max_offset, concurrent_writers_lose_and_interleave_nothing],
    with the ``concurrent_writers`` capability: appends and reads from many threads; no offset
    lost or doubled; the messages of one batch are consecutive in each queue (nothing from
    another writer inside); one writer's appends keep their order; ``read_queue`` never shows an
    entry that ``max_offset`` read afterwards does not count.

    Durability [close_and_reopen_keep_everything, restart_after_kill_mid_write]: ``close`` keeps
    everything; offsets, keys and ids are the same after reopening and appends continue after
    the last offsets. ``close`` is idempotent.

    Retention [retention_keeps_fresh_and_stays_consistent], with the ``retention`` capability:
    ``clean_expired`` removes nothing that is not expired; after removing, each queue is readable
    from its ``min_offset`` to its ``max_offset`` without holes, entries below ``min_offset`` are
    not returned, and appends continue at the old max offset, also after a reopen.

    A model-based clause [stateful_against_reference_model] mixes appends, batches, reads,
    queries, clock steps and reopens and compares every answer with plain Python lists.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``
        [declares_storage_and_satisfies_protocol]."""

    def append(self, request: AppendRequest) -> AppendResult:
        """Store one message; assign its queue offset, commit-log offset and store timestamp.

        Returns PUT_OK, or FLUSH_DISK_TIMEOUT when sync flush did not complete in time (the
        message is stored but not known durable). Raises StoreError (StoreFullError when the disk
        is above the critical watermark), MessageTooLargeError or ValidationError (a topic name
        that breaks the name rule); a refused write leaves nothing behind.
        """

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Store several messages atomically where the engine allows (one flush covers all).

        Results are in request order; queue offsets are consecutive per queue, with no other
        writer's message between them. An empty batch returns ``[]``. If any request is refused
        (size, name), none is written.
        """

    def read(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message at ``commit_log_offset`` (``size`` is a hint), or None if there is none.

        Never returns a record that fails its integrity check; None for any position past the
        end, however far.
        """

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        """Up to ``max_entries`` consume-queue entries from queue offset ``offset`` on, in order.

        Each entry carries the message's commit-log offset, size and tags code. Empty when
        ``offset`` is at or past the max offset, when ``max_entries`` is 0, and for an unknown
        topic or queue; entries below ``min_offset`` are never returned. Reading
        entries never touches the commit log, so a broker-side pre-check can reject entries
        cheaply.
        """

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest queue offset still readable (0 until retention removes something)."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last queue offset written (0 for an empty or unknown queue)."""

    def queues(self) -> Mapping[str, int]:
        """Topic -> number of queues seen (highest queue id written + 1), for recovery and admin."""

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        """Look a message up by its offset message id (one read); None if not found (also for an
        id past the end); never a damaged record."""

    def query_by_key(
        self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose keys or unique id equal ``key``, stored in [begin, end].

        ``Prop.KEYS`` holds space-separated keys, each a key; ``Prop.UNIQ_KEY`` is a key too. Both
        bounds are inclusive store timestamps; at most ``max_results`` messages; ``[]`` for an
        unknown topic or key. Only with the ``query_by_key`` capability
        [query_by_key_and_time_range].
        """

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= ``timestamp_ms``; the max offset if none
        (0 for an empty queue). Only with the ``query_by_time`` capability [offset_for_timestamp]."""

    def flush(self) -> None:
        """Make everything appended so far durable."""

    def clean_expired(self, now_ms: int) -> int:
        """Apply the retention policy at ``now_ms``; return how many segments/files were removed.

        Called by the broker every few seconds of its clock. Never removes a record at or above
        ``context.retention.lowest()`` (what a consumer group or a service still needs) unless
        the disk forces it, which is logged and counted.
        """

    def stats(self) -> Mapping[str, float]:
        """Counters for metrics (bytes written, messages, flushes, ...)."""

    def close(self) -> None:
        """Stop background work, flush, and release files. Idempotent."""


def _chunk_bytes(value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValidationError(f"a log chunk's data must be bytes, got {type(value).__name__}")
    return bytes(value)


@attrs.frozen
class LogChunk:
    """A run of whole commit-log records, as the store keeps them, from offset ``start``.

    ``data`` holds the bytes of the log from ``start`` (a record boundary) to ``end`` (the next
    record boundary); the store decides the encoding (``ReplicableStore.log_format``), so only a
    store of the same format can take the chunk. ``records``: how many messages it holds.
    """

    start: int = attrs.field(validator=non_negative_int)
    data: bytes = attrs.field(converter=_chunk_bytes, repr=lambda d: f"<{len(d)} bytes>")
    records: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def end(self) -> int:
        return self.start + len(self.data)


LogListener = Callable[[int], None]
"""Told the new end of the commit log after records became readable (on the appending thread)."""


@runtime_checkable
class ColumnAppending(Protocol):
    """A store that can answer a batch append with its results as columns (store_mmap).

    The broker's ``put_batch`` takes this path when the store has it, else ``append_batch``.
    Clause [append_columns_stores_what_append_batch_stores]: the same requests stored through
    either leave the same bytes in the store, read back the same, and answer the same results.
    """

    def append_columns(self, requests: Sequence[AppendRequest]) -> AppendColumns:
        """``append_batch`` exactly (checks, refusals, flush wait, listeners), its results as columns.

        ``list(result)`` equals what ``append_batch`` returns for the same requests; an empty
        batch returns an empty AppendColumns.
        """
        ...


@runtime_checkable
class DirectAppending(Protocol):
    """A store whose plain single append a compiled caller may call without Python objects in
    between (store_mmap): no AppendRequest built, no AppendResult answered, no Python frame.

    The broker's compiled single put (plugmq.kit.requestcodec.put_one) calls it with a message's
    fields; see ``plugmq/kit/_directappend.h`` for the C interface. It must leave the store exactly
    as ``append`` of the same request would, with the same checks and errors, and may decline a
    call (the caller then calls ``append``) - it must whenever ``append`` would do more than
    store: tell a log listener, wait for a sync flush. Clause
    [direct_append_stores_what_append_stores]: records stored either way read back the same, with
    the same results, index entries and errors.
    """

    def direct_append(self) -> object | None:
        """A PyCapsule named ``plugmq.direct_append`` of the store's direct append, or None when
        this store cannot offer one now (its appends wait for the disk, or no compiled kernel)."""
        ...


@runtime_checkable
class FlushMode(Protocol):
    """A store that says whether its appends wait for the disk. A caller on an event loop (``plugmq
    serve``) stores on its own thread when they do not, and hands the append to a thread when they
    do; a store without this capability is taken to wait."""

    @property
    def appends_wait_for_disk(self) -> bool:
        """True when an append returns only once its records are durable (a sync flush)."""
        ...


@runtime_checkable
class LogPositioned(Protocol):
    """A store whose commit log is a sequence of records at byte offsets (every replicable store).

    The broker reads the end to know what a ``sync_master`` send must see replicated and how far a
    state journal's snapshot lies behind the log.
    """

    def log_end_offset(self) -> int:
        """Where the next record goes: every record below is complete and readable."""


@runtime_checkable
class QueuePreparing(Protocol):
    """A store that makes a queue's files ahead of its writes (store_mmap).

    The broker asks for each state journal's queue at start, while descriptors are to be had: a
    full descriptor table later refuses new queues with a clear error, but never a journal
    record (pop state, offsets, transactions) whose file was not made yet.
    """

    def prepare_queue(self, topic: str, queue_id: int) -> None:
        """Make the file that ``queue_id`` of ``topic`` writes its next entry to (creating the queue)."""
        ...


@runtime_checkable
class QueueRepairing(Protocol):
    """A store that rebuilds damaged consume-queue entries from its commit log on a read miss."""

    def repair_queue(self, topic: str, queue_id: int, offset: int) -> bool:
        """The entry at ``offset`` led to no message (or to another one): check the entries around
        it against the log and rebuild the damaged ones. True when entries were rewritten (the
        reader reads again); False when the message is lost (the store logs and counts it once)."""


@runtime_checkable
class BulkReading(Protocol):
    """A store that reads the messages of many consume-queue entries in one call (store_mmap).

    Pulls, pop receives, the server's receive and the delay plugins' write-back read runs of
    records; a store that decodes a run at once (in C, as it encodes appends) saves the per-record
    call. The answer must equal ``[read(e.commit_log_offset, e.size) for e in entries]`` record
    for record (the storage conformance suite checks it).
    """

    def read_many(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        """The message of each entry, in order; None where ``read`` would answer None."""
        ...


@runtime_checkable
class QueueRunReading(Protocol):
    """A store that reads a run of a queue's messages in one call, entries and records together
    (store_mmap).

    A plain pull (no filter, every message visible) wants the messages of a queue's next entries,
    not the entries: a store that reads both at once builds no ConsumeQueueEntry and makes one
    call per run. The answer is the fast path only: where it is not None it must equal
    ``[read(e.commit_log_offset, e.size) for e in read_queue(topic, queue_id, offset, max_messages)]``
    with each message exactly what its entry says (size, tags code, queue, queue offset, topic);
    a store answers None when one is not, and the caller reads that stretch with ``read_queue``
    and ``read`` (whose checks and repairs decide). The storage conformance suite checks it.
    """

    def read_queue_run(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[StoredMessage] | None:
        """Up to ``max_messages`` messages of ``topic``/``queue_id`` from ``offset`` (from the first
        kept entry when ``offset`` is below it; fewer than asked is no end of the queue), in queue
        order; [] when there is none to read there; None when an entry's record is not exact."""
        ...


_T = TypeVar("_T")
_ANSWERS: dict[tuple[type, type], bool] = {}


def has_capability(obj: object, protocol: type[_T]) -> TypeGuard[_T]:
    """``isinstance(obj, protocol)`` for a runtime-checkable capability Protocol, cached per class.

    Python 3.11 checks a runtime Protocol by looking up each of its members on every call: tens of
    microseconds when the answer is no, too much on a per-message path. A capability (of a store
    or any plugin object) is what its class implements, so the first answer for a class holds for
    all its objects.
    """
    key = (type(obj), protocol)
    answer = _ANSWERS.get(key)
    if answer is None:
        answer = _ANSWERS[key] = isinstance(obj, protocol)
    return answer


def read_entries(store: MessageStore, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
    """Read the messages of ``entries`` in one call when the store can, one by one otherwise."""
    if has_capability(store, BulkReading):
        return store.read_many(entries)
    read = store.read
    return [read(entry.commit_log_offset, entry.size) for entry in entries]


@runtime_checkable
class RecoveryFigures(Protocol):
    """What opening a store found: where the check of its log began and ended, what it cut."""

    @property
    def checked_from(self) -> int:
        """The commit-log offset the open checked from (-1 when not known)."""

    @property
    def end(self) -> int:
        """The log end the open settled on."""

    @property
    def redispatched(self) -> int:
        """Records whose queue and index entries were rebuilt from the log."""

    @property
    def cut_bytes(self) -> int:
        """Bytes of torn or damaged tail cut at open."""


@runtime_checkable
class RecoveryReporting(Protocol):
    """A store that keeps what its last open found (``plugmq bench store`` prints it)."""

    @property
    def recovery(self) -> RecoveryFigures:
        """The figures of the open that made this store object."""


@runtime_checkable
class ReplicableStore(MessageStore, LogPositioned, Protocol):
    """A MessageStore whose commit log can be shipped to a slave and rebuilt there (RocketMQ's HA).

    A store declaring the ``replication`` capability implements these methods; the rules below
    are what ``plugmq.conformance.storage`` checks with a master store and a slave store of the
    same plugin (clause names in brackets):

    - The log is a sequence of records at byte offsets; ``log_end_offset`` is where the next
      record goes and every record below it is complete and readable.
    - Shipping: ``read_log`` on the master and ``append_log`` on the slave, chunk after chunk
      from the slave's ``log_end_offset``, give the slave byte-for-byte the same messages at the
      same commit-log offsets, queue offsets, store timestamps and message ids (the ids name the
      master's store host), with consume queues and key / time indexes rebuilt from the records:
      every read, ``read_queue``, ``max_offset``, ``query_by_id``, ``query_by_key`` and
      ``offset_for_timestamp`` answers the same on both sides, also after the slave is reopened
      [replicated_log_is_identical, replicated_log_survives_reopen].
    - ``append_log`` checks every record of a chunk before it writes anything: a chunk with a
      torn or damaged record, one that does not start at the slave's end, or one of another
      format is refused whole (StoreError; CorruptRecordError for damage) and the slave is
      unchanged and usable [torn_or_misplaced_chunk_refused_whole].
    - ``truncate_log(offset)`` cuts every record at or after ``offset`` with its consume-queue and
      index entries; appends (local or replicated) continue at ``offset``, so a cut slave takes
      the master's log from there [truncate_then_resume].
    - A store with an empty log takes a first chunk that starts anywhere (a new slave of a
      master whose oldest records were removed by retention); its queues then start at the queue
      offsets the records carry [empty_store_adopts_the_master_start].
    - The log listener hears of every append (local or replicated) with the new end offset,
      before a sync-flush append waits for its flush, so shipping overlaps the flush
      [log_listener_hears_every_append].
    """

    @property
    def log_format(self) -> str:
        """Names the byte format of the records and any layout a slave must share (e.g. segment
        size); a master ships only to a slave whose store has the same ``log_format``."""

    def log_min_offset(self) -> int:
        """The offset of the oldest record still held (retention moves it up)."""

    def read_log(self, offset: int, max_bytes: int) -> LogChunk:
        """Whole records from ``offset`` on, about ``max_bytes`` at most (never less than one record).

        ``offset`` must be a record boundary between ``log_min_offset`` and ``log_end_offset``;
        at the end the chunk is empty. Below the oldest record held (removed by retention) the
        chunk starts at ``log_min_offset``; a store whose log may have holes (offsets never
        reused after a crash cut) starts it at the next record held. Raises StoreError for an
        offset that is not a record boundary.
        """

    def append_log(self, chunk: LogChunk) -> int:
        """Append the master's records at exactly their offsets; return the new end offset.

        ``chunk.start`` must be this store's ``log_end_offset`` (or, for a store whose log may
        have holes, above it; for an empty log, anywhere). Consume queues and indexes are rebuilt
        from the records. With sync flush the records are durable when this returns. Refuses
        the whole chunk (StoreError, CorruptRecordError) before writing anything when a record is
        torn, damaged, misplaced or of another format.
        """

    def truncate_log(self, offset: int) -> int:
        """Remove every record at or after ``offset`` (a record boundary) with its queue and index
        entries, durably; appends continue at ``offset``. Returns how many records went."""

    def set_log_listener(self, listener: LogListener | None) -> None:
        """Call ``listener(end_offset)`` after every append (None removes it). It runs on the
        appending thread, possibly under a store lock: it must only signal another thread."""
