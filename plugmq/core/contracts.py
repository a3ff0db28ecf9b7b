"""Component contracts: what each plugin family hands the broker.

The hook specs (``hookspecs.py``) say *when* a plugin is asked; these Protocols say *what* the
returned components must do. Capabilities are frozen attrs values a plugin declares so the broker
and the conformance suite can tell a missing feature from a broken one. Each family's
conformance suite (``plugmq.conformance``) checks exactly the rules written here.

Data members of a Protocol (``capabilities``, ``name``, ``expression_type``, ...) are declared as
read-only properties: an implementation may provide them as a class attribute, an instance
attribute, an attrs field or a property, and type-checks as the Protocol either way. The core
only reads them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.clock import Clock
from plugmq.core.errors import ValidationError
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    ConsumeQueueEntry,
    MessageQueue,
    SendStatus,
    StoredMessage,
)
from plugmq.core.names import validate_broker_name, validate_cluster_name, validate_room
from plugmq.core.retention import RetentionFloor

__all__ = [
    "SYSTEM_RECORD_HEADROOM",
    "AllocateStrategy",
    "AllocateStrategyFactory",
    "AllocationCapabilities",
    "BrokerRegistration",
    "BrokerRole",
    "ClusterContext",
    "ClusterListener",
    "ClusterService",
    "ClusterTopic",
    "ClusterView",
    "ConsumerHandover",
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    "Deliver",
    "DeliverBatch",
    "FailoverReplication",
    "Family",
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "JournalReplay",
    "LogChunk",
    "LogListener",
    "Mastership",
    "MastershipListener",
    "MessageStore",
    "PluginContext",
    "PluginDeclaration",
    "QueuePreparing",
    "ReplicaStatus",
    "ReplicableStore",
    "Replicated",
    "ReplicationCapabilities",
    "ReplicationContext",
    "ReplicationService",
    "ReplicationStatus",
    "StateJournal",
    "StoreCapabilities",
    "SystemTopicWriter",
    "TopicPermission",
    "TopicRegistration",
    "TransactionCapabilities",
    "TransactionContext",
    "TransactionDecision",
    "TransactionService",
    "WasDelivered",
]


class Family(enum.Enum):
    """The plugin families and how many plugins of each a broker may hold."""

    STORAGE = "storage"  # exactly one
    DELAY = "delay"  # zero or one
    FILTER = "filter"  # any number, keyed by expression type
    ALLOCATION = "allocation"  # any number, keyed by strategy name
    TRANSACTION = "transaction"  # zero or one
    EVENTS = "events"  # any number
    CLUSTER = "cluster"  # zero or one
    REPLICATION = "replication"  # zero or one


def _families(value: Iterable[Family]) -> frozenset[Family]:
    return frozenset(value)


@attrs.frozen
class PluginDeclaration:
    """What a plugin says about itself (returned by ``plugmq_declare``).

    ``name`` must equal the plugin's entry-point name. ``families``: any iterable of
    :class:`Family` (a set literal is fine). ``capabilities`` is the family's capability value
    (for keyed families, a mapping key -> capability value).

    ``options`` is an attrs class whose fields are the keys allowed in the plugin's
    ``[plugins.<name>]`` config table (None: the plugin takes no options). Every field has a
    default and a type annotation; the core checks each value against the annotation before the
    class is built, so validators only see values of the declared type. Validators (attrs'
    own, or functions raising ValueError / TypeError / ConfigError) say what else a value must
    satisfy, in words a user can act on; ``metadata={"expected": "..."}`` words the expectation
    when the type does not. The core reports any failure as one ConfigError naming the plugin,
    the key, the value and what is expected (``plugmq.core.plugin_options``).
    """

    name: str
    families: frozenset[Family] = attrs.field(converter=_families)
    description: str = ""
    options: type | None = None
    capabilities: Any = None


SYSTEM_RECORD_HEADROOM = 1024 * 1024
"""How much larger than a client body a broker-written record may be (see PluginContext)."""


@attrs.frozen
class PluginContext:
    """What a component factory gets: the broker's identity, its clock, where its files go.

    ``options`` maps plugin name -> that plugin's validated options object; a plugin reads its own
    with ``context.options_for("store_mmap")``. ``plugin_dir(name)`` is the directory a plugin
    owns under the broker's data dir (created on first use).

    ``retention`` (None outside a broker) is the floor retention never cleans below: a store asks
    ``retention.lowest()`` for the lowest commit-log offset a consumer group or a service still
    needs; a service that keeps messages in the store registers what it needs with
    ``retention.hold(name, source)``.

    ``max_message_size`` is the broker's limit for a client's message body (the broker checks it
    before a store sees the message). ``store_body_limit`` is the largest body a store must accept:
    larger by ``SYSTEM_RECORD_HEADROOM``, because the broker's own records (state snapshot parts,
    delay intents that wrap a whole client message) go into the same store.
    """

    broker_name: str
    data_dir: Path
    clock: Clock
    store_host: str = "127.0.0.1:10911"
    max_message_size: int = 4 * 1024 * 1024
    options: Mapping[str, Any] = attrs.field(factory=dict)
    retention: RetentionFloor | None = None
    store_body_limit: int = attrs.field()

    @store_body_limit.default
    def _client_limit_plus_headroom(self) -> int:
        return self.max_message_size + SYSTEM_RECORD_HEADROOM

    def options_for(self, plugin: str) -> Any:
        return self.options.get(plugin)

    def plugin_dir(self, plugin: str) -> Path:
        path = self.data_dir / plugin
        path.mkdir(parents=True, exist_ok=True)
        return path


@runtime_checkable
class SystemTopicWriter(Protocol):
    """What an observer plugin may write: its own records on a system topic of the broker.

    Handed to ``plugmq_broker_started``. ``append_system_records`` stores each body as one message of
    ``topic`` (queue 0, created when missing), with ``keys`` (white-space free) indexed so a
    query by key finds it, in one store batch. No event hook fires for these records (an observer
    writing what it observes would observe itself). Raises a PlugmqError when the broker cannot
    write (a slave, a full disk, a closed broker): the caller decides whether to drop or retry.
    """

    def append_system_records(self, topic: str, records: Sequence[tuple[bytes, Sequence[str]]]) -> int:
        """Store ``(body, keys)`` records on system topic ``topic``; returns how many were stored."""
        ...


# --------------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------------


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


def _non_negative_offset(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{attribute.name} must be an integer >= 0, got {value!r}")


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

    start: int = attrs.field(validator=_non_negative_offset)
    data: bytes = attrs.field(converter=_chunk_bytes, repr=lambda d: f"<{len(d)} bytes>")
    records: int = attrs.field(default=0, validator=_non_negative_offset)

    @property
    def end(self) -> int:
        return self.start + len(self.data)


LogListener = Callable[[int], None]
"""Told the new end of the commit log after records became readable (on the appending thread)."""


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
class ReplicableStore(MessageStore, Protocol):
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

    def log_end_offset(self) -> int:
        """Where the next record goes: every record below is complete and readable."""

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


# --------------------------------------------------------------------------------------------
# state journal (a service's state as records in the commit log)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class JournalReplay:
    """What :meth:`StateJournal.replay` found: the latest complete snapshot (None when the journal
    holds none) and the records written after it, oldest first."""

    snapshot: bytes | None
    records: tuple[bytes, ...]


@runtime_checkable
class StateJournal(Protocol):
    """A service's state as records of its own system topic in the store (``plugmq.broker.journal``).

    The broker hands one to each stateful service (``TransactionContext.journal``,
    ``DelayContext.journal``). The service keeps its state in memory, appends a record before a
    change takes effect, writes a snapshot of the whole state now and then (records before it are
    no longer replayed), and rebuilds at start from :meth:`replay`. Records travel to slaves with
    the messages, in one order, so a promoted slave replays the state its master had at the
    offset it holds, and a cut of the log (fencing) removes messages and state together.
    """

    @property
    def writable(self) -> bool:
        """False on a slave: the replication stream alone writes its store."""

    @property
    def bytes_since_snapshot(self) -> int:
        """Bytes of records written (or followed) since the latest snapshot."""

    def append(self, bodies: Sequence[bytes]) -> int:
        """Store records in one batch; returns the log offset past the last, for :meth:`settle`.
        ReadOnlyBrokerError where the journal is not writable."""

    def write_snapshot(self, data: bytes) -> int:
        """Store the whole state (the caller holds its lock: none of its records falls inside)."""

    def replay(self) -> JournalReplay:
        """The latest complete snapshot and the records after it."""

    def follow(self) -> list[bytes] | None:
        """Records stored since the last replay, follow or append (snapshots skipped); None when
        the log was cut below them, so the service must replay afresh."""

    def settle(self, end_offset: int) -> SendStatus:
        """On a ``sync_master``, wait until a slave holds the log up to ``end_offset``."""

    def snapshot_due(self) -> bool:
        """Whether the latest snapshot holds retention back so far that a new one is wanted."""

    def sync(self) -> None:
        """Make every record written so far durable (the store's flush), for services whose
        option asks for it beyond the store's flush mode."""


# --------------------------------------------------------------------------------------------
# delay
# --------------------------------------------------------------------------------------------

Deliver = Callable[[AppendRequest], AppendResult]
"""The broker's write-back: stores a due message as a normal message on its real topic/queue."""

DeliverBatch = Callable[[Sequence[AppendRequest]], list[AppendResult]]
"""The broker's batched write-back: stores several due messages (any topics and queues) with one
``store.append_batch``; results in request order. Raises like ``Deliver``; after a crash any prefix
of the batch may be stored, which ``WasDelivered`` settles message by message."""


@attrs.frozen
class DelayCapabilities:
    """What a delay strategy can express.

    ``levels_ms``: the fixed level delays (level n = ``levels_ms[n-1]``) for level-based
    strategies, None for arbitrary-delay ones. ``max_delay_ms``: the longest delay accepted
    (None = unbounded). ``clamps``: a too-long delay is clamped to the maximum instead of refused.
    ``resolution_ms``: one tick; lateness on ManualClock stays within it.
    """

    cancel: bool
    arbitrary_delay: bool
    levels_ms: tuple[int, ...] | None = None
    max_delay_ms: int | None = None
    clamps: bool = False
    resolution_ms: int = 1000
    no_duplicates_after_restart: bool = True


WasDelivered = Callable[[AppendRequest], bool]
"""Whether a message with this request's unique id (``Prop.UNIQ_KEY``) is already on its real
topic: lets a strategy settle a delivery that was in doubt when the process died."""


@attrs.frozen
class DelayContext(PluginContext):
    """PluginContext plus the store (for strategies that keep messages in it) and the write-back.

    ``deliver`` writes a due message to its real topic/queue. ``deliver_batch`` (optional; the
    broker always passes it) writes many at once: a burst of due messages costs one store batch,
    one stored-event pass and one consumer wake-up instead of one each; a strategy falls back to
    ``deliver`` per message when it is None. ``was_delivered`` answers, after a crash, whether a
    delivery whose completion was not recorded did reach the store, so a restart neither loses nor
    duplicates it. ``journal`` (in a broker): where the strategy keeps state that must follow the
    messages to a slave (see :class:`StateJournal`).
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None
    was_delivered: WasDelivered | None = None
    journal: StateJournal | None = None
    deliver_batch: DeliverBatch | None = None


@runtime_checkable
class DelayScheduler(Protocol):
    """Holds delayed messages until due, then writes them back through ``context.deliver``.

    The rules ``plugmq.conformance.delay`` checks (clause names in brackets):

    - Timing only through the context's clock (timers via ``clock.call_at``). Never early; late
      by at most ``capabilities.resolution_ms`` (a tick, in milliseconds), checked after every
      step of a ManualClock [never_early_and_late_by_at_most_one_tick]; a burst due at one moment
      goes out completely within that tick, in sending order
      [a_burst_due_at_once_goes_out_within_one_tick_in_order].
    - The write-back is the original message: its real topic and queue, body, every property
      except the delay ones, tags code, reconsume times, born timestamp and host, sys flag; each
      accepted message is written back exactly once.
    - Order: equal deliver times keep sending order (within one level for level strategies); a
      message whose tick is earlier is written back first [order_within_a_level_or_tick].
    - Restarts lose and repeat nothing: a clean close/reopen keeps ``pending()`` and delivers
      nothing again [clean_restart_loses_and_repeats_nothing]; after a SIGKILL while scheduling,
      while dispatching, or right after a write-back returned and before the strategy recorded
      it, every accepted message is written back exactly once and nothing never accepted is
      [restart_after_kill_mid_schedule, restart_after_kill_mid_dispatch,
      kill_right_after_a_write_back (which may land in the middle of a ``deliver_batch``)] —
      ``context.was_delivered`` settles the in-doubt ones.
    - Overdue at start: ``start()`` returns before delivering; what came due while the broker
      was down goes out on the clock's thread right after, oldest first, within one resolution;
      ``metrics()`` reports ``overdue_at_start`` and a ``*late*max`` figure holding that
      lateness [overdue_at_start_oldest_first_and_in_metrics].
    - Cancel answers False for an id of another broker or of no message and raises
      ValidationError for something that is not a message id [cancel_of_unknown_and_malformed_ids].
    - Three simulated days with a restart, ``clean_expired`` after every step, match a reference
      heap [three_simulated_days_match_a_reference_model].
    """

    @property
    def capabilities(self) -> DelayCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``, with default
        options. Consistent: ``resolution_ms >= 1``; an arbitrary-delay strategy has no
        ``levels_ms``; a level strategy lists positive levels and ``max_delay_ms`` is the
        longest [declares_consistent_capabilities]."""

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        """Accept a delayed message durably. ``delay_level`` is set for a level request.

        Raises DelayUnsupportedError when the strategy cannot express the delay: a delay above
        ``max_delay_ms`` (unless it ``clamps``: then it is delivered at the maximum delay)
        [delay_above_max_clamped_or_refused_as_declared]; any non-level request to a strategy
        without ``arbitrary_delay``, even one equal to a level
        [arbitrary_delay_refused_by_level_strategy]. A refused request leaves nothing behind.
        The returned msg_id is what ``cancel`` takes.
        """

    def start(self) -> None:
        """Begin dispatching and return promptly: what came due while the broker was down is
        delivered by clock timers right after, oldest first, not inside this call."""

    def cancel(self, msg_id: str) -> bool:
        """Cancel a not-yet-due message; True if it will not be delivered (also across a
        restart), False if it was already delivered [cancel_honoured]. Strategies without the
        ``cancel`` capability raise DelayUnsupportedError and keep the message scheduled
        [cancel_refused_where_not_declared]."""

    def pending(self) -> int:
        """How many accepted messages are not delivered (or cancelled) yet."""

    def metrics(self) -> Mapping[str, float]:
        """Counters and lateness figures: at least ``delivered``, ``overdue_at_start`` and a
        maximum lateness whose key contains ``late`` and ends with ``max`` (e.g. ``late_ms_max``)."""

    def clean_expired(self, now_ms: int) -> int:
        """Remove the strategy's own files (delay logs, segments, dispatch logs) whose every
        message is delivered or cancelled and whose time is past ``now_ms``; return how many
        files were removed. Never removes anything still needed to deliver a pending message or
        to avoid a duplicate after a restart.

        Called by the broker every few seconds of its clock (RocketMQ's cleanResourceInterval);
        cheap when there is nothing to remove.
        """

    def close(self) -> None:
        """Stop timers and persist state. Idempotent."""


# --------------------------------------------------------------------------------------------
# filter
# --------------------------------------------------------------------------------------------


@attrs.frozen
class FilterCapabilities:
    expression_type: str
    broker_precheck: bool = True


@runtime_checkable
class Filter(Protocol):
    """A compiled subscription expression.

    The rules ``plugmq.conformance.filters`` checks (clause names in brackets):

    - ``expression_type`` is the compiler's and ``expression`` the compiled text, unchanged
      [valid_expressions_compile_to_a_filter].
    - The pre-checks are sound: none of them rejects a message the exact check accepts
      [precheck_never_rejects_a_message_the_exact_check_accepts]. Optional extras a broker may
      use when present: ``precheck_many(codes)`` (a numpy bool mask over an int64 array of tag
      codes; must agree with ``precheck`` entry by entry) and ``precheck_bloom(bits)`` with
      ``bits = property_bloom(properties, tags)`` (False only when a property the expression
      needs for TRUE is surely absent).
    - ``evaluate`` returns exactly True, False or None (the bool singletons, not truthy stand-ins)
      or raises FilterEvaluationError — no other exception, for any properties and tags, also
      for filters compiled from fuzzed input; ``matches`` is True exactly when ``evaluate`` is
      True; ``precheck`` never raises [evaluate_is_three_valued_and_matches_agrees, fuzzed_*].
    """

    @property
    def expression_type(self) -> str:
        """The type it was compiled as ("TAG", "SQL92", ...)."""

    @property
    def expression(self) -> str:
        """The subscription text it was compiled from, unchanged."""

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        """Broker-side check on the consume-queue entry alone. False only if the message surely
        does not match; True means "read it and run the exact check"."""

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        """Exact result: True, False or None (unknown). May raise FilterEvaluationError."""

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        """True only when ``evaluate`` is True; unknown and evaluation errors are no match."""


@runtime_checkable
class FilterCompiler(Protocol):
    """Compiles subscription expressions of one type (the key it is offered under)."""

    @property
    def expression_type(self) -> str:
        """The expression type it compiles; equal to the key of ``plugmq_filter_compilers``."""

    @property
    def capabilities(self) -> FilterCapabilities:
        """What its filters offer the broker; ``capabilities.expression_type`` equals
        ``expression_type`` [capabilities_name_the_expression_type]."""

    def compile(self, expression: str) -> Filter:
        """Compile once per subscription. Bad input of any kind (fuzzed text, token soup, decoded
        random bytes, nesting thousands deep) raises FilterSyntaxError only, with a message and a
        position that is None or inside the expression, in bounded time (no RecursionError, no
        hang) [fuzzed_text/bytes/token_soup_raise_only_filter_syntax_errors,
        pathological_nesting_is_refused_or_compiled_cleanly]."""


# --------------------------------------------------------------------------------------------
# allocation
# --------------------------------------------------------------------------------------------


@attrs.frozen
class AllocationCapabilities:
    """``may_leave_queues_unassigned``: the union over consumers need not cover every queue.

    ``example_params``: keyword parameters that make a working strategy for the conformance
    suite when the strategy needs configuration (e.g. MACHINE_ROOM's ``rooms``).
    """

    may_leave_queues_unassigned: bool = False
    example_params: Mapping[str, Any] = attrs.field(factory=dict)
    # The factory takes ``broker_room`` (broker name -> room) and ``consumer_room`` (consumer id
    # -> room) resolvers, each returning None for "no room"; a broker passes its cluster's rooms.
    room_aware: bool = False


@runtime_checkable
class AllocateStrategy(Protocol):
    """RocketMQ's AllocateMessageQueueStrategy: which queues one consumer of a group takes.

    The rules ``plugmq.conformance.allocation`` checks (clause names in brackets), for inputs
    of distinct queues and distinct consumer ids sorted as the rebalance sorts them, with the
    ``example_params`` the plugin declares for the strategy:

    - Every queue goes to exactly one consumer: the consumers' answers, each computed with the
      consumer's own id over the same lists, are disjoint and cover every queue — unless the
      declared capabilities say ``may_leave_queues_unassigned`` (then disjoint only)
      [every_queue_assigned_exactly_once].
    - Everyone computes the same assignment: members that learned queues and ids in any order
      and sorted them (``rocketmq_sorted``) get the same answers from fresh strategy instances
      [all_consumers_compute_the_same_assignment].
    - Deterministic and pure: the same instance and a fresh one answer the same for the same
      input; the input lists are not modified (never sort or edit them)
      [deterministic_and_leaves_input_alone].
    - More consumers than queues: answers are lists of MessageQueue; every queue still assigned
      once and at least ``consumers - queues`` consumers idle (unless it may leave queues
      unassigned) [more_consumers_than_queues].
    - A consumer id not in the list gets ``[]`` [consumer_not_in_list_gets_nothing].
    """

    @property
    def name(self) -> str:
        """The strategy name; equal to the key of ``plugmq_allocate_strategies``."""

    @property
    def capabilities(self) -> AllocationCapabilities:
        """What the union of the consumers' answers covers (the suite reads the capabilities the
        plugin declares for this strategy name)."""

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        """The current consumer's queues. Inputs arrive sorted by the caller; never sort here."""


AllocateStrategyFactory = Callable[..., AllocateStrategy]
"""Builds a strategy from its keyword parameters (e.g. ``virtual_nodes=10``)."""


# --------------------------------------------------------------------------------------------
# transactions
# --------------------------------------------------------------------------------------------


class TransactionDecision(enum.Enum):
    """The outcome of a local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


@attrs.frozen
class TransactionCapabilities:
    """What a transaction service does, and the check-back schedule it keeps.

    ``check_immunity``: the per-message check-immunity time (``Prop.CHECK_IMMUNITY_SECONDS``)
    replaces ``transaction_timeout`` for that message's first check, without counting checks.
    ``delayed_transactions``: a delayed message may be sent in a transaction (else refused).
    ``persistent_check_count``: checks already made survive a restart (``check_max`` holds
    across crashes). ``transaction_timeout_ms`` / ``check_interval_ms`` / ``check_max``: first
    check this long after the half was stored, then one per interval, at most ``check_max``
    checks; the message goes to the discard topic at the next due time after the last check.
    ``schedule_resolution_ms``: how late (virtual time) a check or discard may come.
    """

    check_immunity: bool = True
    delayed_transactions: bool = False
    persistent_check_count: bool = True
    transaction_timeout_ms: int = 6_000
    check_interval_ms: int = 30_000
    check_max: int = 15
    schedule_resolution_ms: int = 0


@attrs.frozen
class TransactionContext(PluginContext):
    """PluginContext plus the store (half messages may live in it) and the write-back.

    ``deliver`` makes a committed message visible on its real topic/queue (and moves a
    discarded one to the discard topic); every effect of a decision goes through it.
    ``journal`` (in a broker): where the service keeps its op log, so decisions and counted
    checks travel to a slave with the half messages (see :class:`StateJournal`).
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None
    journal: StateJournal | None = None


TransactionChecker = Callable[[StoredMessage], TransactionDecision]
"""A producer group's check listener: given the half message (with its real topic and queue, the
transaction id as ``msg_id``), the state of its local transaction now."""


@runtime_checkable
class TransactionService(Protocol):
    """Half messages, decisions (an op log) and the check-back service.

    The rules ``plugmq.conformance.transactions`` checks, in a broker, on a ManualClock (clause
    names in brackets):

    - A half message is invisible to consumers until committed — also while the local
      transaction runs and while it is UNKNOWN; a committed one appears once on its real topic
      and queue with its body, tags, keys, properties and unique id [invisible_until_commit,
      unknown_stays_invisible_and_is_never_on_the_real_topic_early]. A rollback is never
      visible and never checked [rollback_never_visible_never_checked]; a local transaction that
      raises or answers nothing counts as UNKNOWN and is checked after the timeout
      [exception_or_no_answer_in_local_transaction_counts_as_unknown].
    - Check-back follows the declared schedule: the first check ``transaction_timeout_ms``
      after the half was stored, then one per ``check_interval_ms``, each within
      ``schedule_resolution_ms``, at most ``check_max`` checks; then the message moves to
      ``TRANS_DISCARD_TOPIC`` (``Prop.REAL_TOPIC`` set, unique id kept) with a warning logged,
      and is never checked again [check_schedule_timeout_interval_max_then_discard]. The
      listener gets the half message with its real topic, keys, properties and the transaction
      id as ``msg_id`` [check_listener_sees_the_real_topic_and_the_transaction_id]; its COMMIT
      or ROLLBACK settles the transaction [check_answer_settles].
    - ``Prop.CHECK_IMMUNITY_SECONDS`` (with ``check_immunity``) delays the first check without
      counting checks [check_immunity_delays_first_check_without_burning_counts]; checks of a
      group without a live listener wait uncounted and come due within one interval of a
      listener registering [group_without_live_checker_waits_uncounted].
    - A decision is durable before it takes effect and takes effect at most once: a second
      COMMIT or ROLLBACK of the same transaction changes nothing and returns False, also when
      several threads commit at once (exactly one True each) [decision_twice_has_no_second_effect,
      concurrent_commits_apply_once].
    - Restarts: a clean restart keeps open transactions (checked again) and settled ones (never
      checked again) [clean_restart_keeps_open_and_settled_transactions]; a SIGKILL at any step
      of a transaction's life — in the local transaction, before or after a commit became
      visible, after a rollback, during a check, before a check's commit or a discard became
      visible — ends, after recovery, with the message visible exactly once, discarded exactly
      once or gone, as its decision says, and with checks already made still counted when
      ``persistent_check_count`` [restart_after_kill].
    """

    @property
    def capabilities(self) -> TransactionCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def prepare(self, request: AppendRequest, producer_group: str) -> AppendResult:
        """Store a half message for ``request`` (its real topic/queue), invisible to consumers.

        The returned ``msg_id`` is the transaction id that ``end`` takes. Raises TransactionError
        for a request the service cannot hold — a delayed one without ``delayed_transactions``
        — and then stores nothing, not even on the half topic
        [delayed_transactional_message_refused].
        """

    def end(self, msg_id: str, decision: TransactionDecision, *, from_check: bool = False) -> bool:
        """Record and apply a decision; False if the transaction was already settled.

        UNKNOWN records nothing (the check-back will ask) and returns whether it is still open.
        Raises TransactionError for an id that names no half message
        [unknown_transaction_id_is_an_error].
        """

    def register_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        """Add a live check listener of a producer group (any live one may be asked).

        Checks of a group with no live listener wait without being counted; registering one
        makes the waiting checks due.
        """

    def unregister_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        """Remove a listener added with ``register_checker`` (its producer shut down)."""

    def pending(self) -> int:
        """How many transactions have no decision yet."""

    def metrics(self) -> Mapping[str, float]:
        """Counters (prepared, committed, rolled_back, checks, discarded, ...)."""

    def clean_expired(self, now_ms: int) -> int:
        """Remove files no longer needed (op-log records of settled transactions); return how
        many were removed. Never removes anything an open or undelivered transaction needs.

        Called by the broker every few seconds of its clock. Half messages live in the store: the
        service keeps open ones from the store's retention through ``context.retention``.
        """

    def start(self) -> None:
        """Recover (finish recorded decisions, reload open transactions) and start checking."""

    def close(self) -> None:
        """Stop checking and persist state. Idempotent."""


# --------------------------------------------------------------------------------------------
# cluster (name service)
# --------------------------------------------------------------------------------------------


class BrokerRole(enum.Enum):
    """A broker's role among the brokers sharing its name (RocketMQ's ``brokerRole``).

    The master of a broker name has broker id 0; a slave has an id above 0.
    """

    ASYNC_MASTER = "async_master"
    SYNC_MASTER = "sync_master"
    SLAVE = "slave"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


class TopicPermission(enum.IntFlag):
    """What clients may do with a topic's queues on one broker (RocketMQ's ``PermName`` bits)."""

    NONE = 0
    WRITE = 2
    READ = 4
    READ_WRITE = 6


def _check_queue_count(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValidationError(f"{attribute.name} must be an integer 1..1024, got {value!r}")


def _check_non_negative(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def _check_endpoint(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError(f"{attribute.name} must be 'host:port' with a port 1..65535, got {value!r}")


def _checked_name(check: Callable[[object], str], *, empty_ok: bool = False) -> Callable[..., None]:
    def validate(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
        if not (empty_ok and value == ""):
            check(value)
    return validate


def _permission(value: object) -> TopicPermission:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 2, 4, 6):
        raise ValidationError(f"a topic permission is one of 0, 2 (write), 4 (read), 6 (read+write); got {value!r}")
    return TopicPermission(value)


def _role(value: object) -> BrokerRole:
    try:
        return BrokerRole(value)
    except ValueError:
        raise ValidationError(f"broker role must be one of {', '.join(r.value for r in BrokerRole)}; "
                              f"got {value!r}") from None


@attrs.frozen
class TopicRegistration:
    """One topic on one broker as the name service knows it (RocketMQ's ``QueueData``)."""

    queue_count: int = attrs.field(validator=_check_queue_count)
    permission: TopicPermission = attrs.field(default=TopicPermission.READ_WRITE, converter=_permission)


@attrs.frozen
class ClusterTopic:
    """A topic declared for the whole cluster: every master it applies to creates (or grows) it.

    ``auto_created``: declared because a broker auto-created the topic; such a declaration applies
    only to masters that auto-create topics themselves. An explicit one (an admin's
    ``update-topic --cluster``) applies to every master.
    """

    queue_count: int = attrs.field(validator=_check_queue_count)
    permission: TopicPermission = attrs.field(default=TopicPermission.READ_WRITE, converter=_permission)
    auto_created: bool = False


def _topic_registrations(topics: Mapping[str, TopicRegistration]) -> dict[str, TopicRegistration]:
    return dict(topics)


def _cluster_topics(topics: Mapping[str, ClusterTopic]) -> dict[str, ClusterTopic]:
    return dict(topics)


@attrs.frozen
class BrokerRegistration:
    """What a live broker publishes about itself: ephemeral state of its name-service session.

    ``endpoint`` is where clients reach it (the advertised gRPC address). ``room``: its machine
    room ("" when none is configured). ``epoch``: the master epoch this broker holds, 0 when it
    holds none. ``auto_create_topics`` / ``default_queue_count``: how it treats an unknown topic.
    ``replication``: where this broker's slaves connect while it is master (its replication
    plugin's address; "" when it serves none), so a failover slave finds the elected master.
    ``log_epoch``: the newest master epoch its log knows (failover: who may stand when no broker
    of the name is caught up).
    """

    cluster: str = attrs.field(validator=_checked_name(validate_cluster_name))
    broker_name: str = attrs.field(validator=_checked_name(validate_broker_name))
    endpoint: str = attrs.field(validator=_check_endpoint)
    broker_id: int = attrs.field(default=0, validator=_check_non_negative)
    room: str = attrs.field(default="", validator=_checked_name(validate_room, empty_ok=True))
    role: BrokerRole = attrs.field(default=BrokerRole.ASYNC_MASTER, converter=_role)
    topics: Mapping[str, TopicRegistration] = attrs.field(factory=dict, converter=_topic_registrations)
    auto_create_topics: bool = True
    default_queue_count: int = attrs.field(default=4, validator=_check_queue_count)
    epoch: int = attrs.field(default=0, validator=_check_non_negative)
    replication: str = ""
    log_epoch: int = attrs.field(default=0, validator=_check_non_negative)

    @property
    def key(self) -> str:
        """``<broker name>.<broker id>``: unique in a cluster ("." never occurs in a broker name)."""
        return f"{self.broker_name}.{self.broker_id}"

    @property
    def is_master(self) -> bool:
        """Broker id 0 in a master role, or (failover) the elected master: a master role and an epoch."""
        return self.role.is_master and (self.broker_id == 0 or self.epoch > 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a name-service plugin stores, what ``--json`` output shows)."""
        return {
            "cluster": self.cluster, "broker_name": self.broker_name, "broker_id": self.broker_id,
            "endpoint": self.endpoint, "room": self.room, "role": self.role.value, "epoch": self.epoch,
            "replication": self.replication, "log_epoch": self.log_epoch,
            "auto_create_topics": self.auto_create_topics, "default_queue_count": self.default_queue_count,
            "topics": {name: {"queues": t.queue_count, "perm": int(t.permission)}
                       for name, t in sorted(self.topics.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BrokerRegistration:
        """Rebuild a registration from :meth:`as_dict` output; ValidationError names what is wrong."""
        try:
            topics = {str(name): TopicRegistration(t["queues"], t.get("perm", 6))
                      for name, t in dict(data.get("topics", {})).items()}
            return cls(cluster=data["cluster"], broker_name=data["broker_name"], endpoint=data["endpoint"],
                       broker_id=data.get("broker_id", 0), room=data.get("room", ""),
                       role=data.get("role", BrokerRole.ASYNC_MASTER.value), topics=topics,
                       auto_create_topics=bool(data.get("auto_create_topics", True)),
                       default_queue_count=data.get("default_queue_count", 4), epoch=data.get("epoch", 0),
                       replication=str(data.get("replication", "")), log_epoch=data.get("log_epoch", 0))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValidationError(f"not a broker registration ({type(exc).__name__}: {exc}): {dict(data)!r:.200}") from exc


@attrs.frozen
class Mastership:
    """An election won: this broker is the master of ``broker_name`` for ``epoch``.

    Epochs of a broker name only grow, by one per election won, so anything stamped with an older
    epoch comes from a master that has lost its place since (a fencing token).
    """

    broker_name: str
    broker_id: int
    epoch: int


@attrs.frozen
class ClusterView:
    """A snapshot of the cluster: the live brokers and the declared topics.

    ``brokers`` is sorted by (broker name, broker id). ``connected`` is False when the service has
    lost its connection to the name service; the view is then the last one seen, possibly stale.
    """

    cluster: str
    brokers: tuple[BrokerRegistration, ...] = ()
    topics: Mapping[str, ClusterTopic] = attrs.field(factory=dict, converter=_cluster_topics)
    connected: bool = True

    def broker(self, broker_name: str, broker_id: int = 0) -> BrokerRegistration | None:
        return next((b for b in self.brokers if b.broker_name == broker_name and b.broker_id == broker_id), None)

    def masters(self) -> list[BrokerRegistration]:
        """The live masters (broker id 0, a master role), in broker-name order."""
        return [b for b in self.brokers if b.is_master]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every live broker (name, id, role, room, endpoint, epoch, topics) and the
        topics declared for the whole cluster (what ``plugmq admin cluster-list`` shows)."""
        return {
            "cluster": self.cluster, "connected": self.connected,
            "brokers": [b.as_dict() for b in self.brokers],
            "topics": {name: {"queues": t.queue_count, "perm": int(t.permission), "auto_created": t.auto_created}
                       for name, t in sorted(self.topics.items())},
        }


ClusterListener = Callable[[ClusterView], None]
"""Called with every new ClusterView (on the cluster service's thread: return quickly)."""

MastershipListener = Callable[["Mastership | None"], None]
"""Called with the Mastership when an election is won, and with None when it is lost."""


@attrs.frozen
class ClusterContext(PluginContext):
    """PluginContext plus the name of the cluster the broker joins (``[cluster] name``)."""

    cluster_name: str = ""


@runtime_checkable
class ClusterService(Protocol):
    """A broker's session with its cluster's name service.

    The registration is ephemeral: it disappears when the session ends (``close``, or a crash once
    the session timeout passes), and the service registers again by itself when a lost session is
    replaced by a new one. A dead peer, a lost connection or an expired session never raises into
    the broker: the service logs what happened and heals when the name service is back. Listeners
    run on the service's own thread and must return quickly.
    """

    def register(self, registration: BrokerRegistration) -> None:
        """Publish this broker (replacing this service's earlier registration), waiting briefly for it.

        If an earlier session (a previous run that died) still holds the same broker name and id,
        the registration is published once that session expires. Raises ClusterError only for a
        registration of another cluster than the service's.
        """

    def update_topics(self, topics: Mapping[str, TopicRegistration]) -> None:
        """Replace the registered topics; kept and published on reconnect while disconnected."""

    def unregister(self) -> None:
        """Withdraw the registration at once (clean shutdown); routes stop naming this broker."""

    def declare_topic(self, topic: str, declaration: ClusterTopic) -> None:
        """Record a cluster-wide topic (create, or grow its queue count); persistent, not ephemeral.

        Raises ClusterError when the name service cannot be reached.
        """

    def view(self) -> ClusterView:
        """The latest snapshot of the live brokers and declared topics (no round trip); already
        read when the factory returns the service, so a one-shot admin tool can use it at once."""

    def subscribe(self, listener: ClusterListener) -> Callable[[], None]:
        """Call ``listener(view)`` now and after every change; returns the function that unsubscribes."""

    def campaign(self, listener: MastershipListener) -> None:
        """Stand for master of the registered broker name, until ``withdraw`` or ``close``.

        ``listener`` gets the Mastership (with a new, higher epoch) each time an election is won and
        None when mastership is lost (session expired, withdrawn). Call ``register`` first.
        """

    def withdraw(self) -> None:
        """Stop standing for master, giving mastership up if held."""

    def current_epoch(self, broker_name: str) -> int:
        """The latest epoch granted for ``broker_name`` (0 if none), read from the name service."""

    @property
    def connected(self) -> bool:
        """Whether the session with the name service is up right now."""

    def close(self) -> None:
        """End the session: the registration disappears and campaigns stop. Idempotent."""


# --------------------------------------------------------------------------------------------
# replication (master / slave)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class ReplicationCapabilities:
    """What a replication plugin does.

    ``sync_double_write``: a ``sync_master`` acks a send only once a slave holds it.
    ``failover``: it promotes a slave and fences an old master by epoch (the cluster's election).
    ``replicates_state``: besides the commit log, it carries the state of delay, transaction,
    offset and pop services.
    """

    sync_double_write: bool = True
    failover: bool = False
    replicates_state: bool = False


@attrs.frozen
class ReplicaStatus:
    """One slave as its master sees it. ``lag_bytes``: the master's log end minus what the slave
    confirmed; ``lag_messages``: the records in that range (None when not counted)."""

    broker_id: int
    address: str
    confirmed_offset: int
    lag_bytes: int
    lag_messages: int | None = None
    in_sync: bool = True


@attrs.frozen
class ReplicationStatus:
    """A broker's replication as ``plugmq admin`` and metrics show it.

    On a master: ``address`` is where slaves connect, ``end_offset`` the log end,
    ``confirmed_offset`` the highest offset a slave confirmed, ``slaves`` the connected ones. On a
    slave: ``address`` is the master's, ``end_offset`` what it holds, ``master_end_offset`` the
    master's end as last heard, ``connected`` whether the stream is up. ``epoch`` is the master
    epoch the broker works under (0 without failover).
    """

    role: BrokerRole
    broker_id: int
    address: str
    end_offset: int
    confirmed_offset: int
    slaves: tuple[ReplicaStatus, ...] = ()
    master_end_offset: int | None = None
    connected: bool = False
    epoch: int = 0

    @property
    def lag_bytes(self) -> int:
        """The master's end minus what the (best) slave confirmed; on a slave, its own lag."""
        if self.role is BrokerRole.SLAVE:
            return max(0, (self.master_end_offset or self.end_offset) - self.end_offset)
        return max(0, self.end_offset - self.confirmed_offset) if self.slaves else 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``plugmq admin`` and the metrics exporter read)."""
        return {
            "role": self.role.value, "broker_id": self.broker_id, "address": self.address,
            "end_offset": self.end_offset, "confirmed_offset": self.confirmed_offset,
            "master_end_offset": self.master_end_offset, "connected": self.connected, "epoch": self.epoch,
            "lag_bytes": self.lag_bytes,
            "slaves": [attrs.asdict(s) for s in self.slaves],
        }


Replicated = Callable[[int], None]
"""The broker's hook on a slave: records up to this end offset were appended (wake consumers,
learn new topics)."""

ConsumerHandover = list[tuple[str, str, int, int]]
"""Consumer progress a slave's own readers made: ``(group, topic, queue id, done below)``, every
offset of the queue below ``done below`` acknowledged (or done) for the group."""


@attrs.frozen
class ReplicationContext(PluginContext):
    """PluginContext plus the store to ship or fill, the broker's role and id, and the slave's hook.

    ``store`` is a :class:`ReplicableStore` (the broker refuses a store without the
    ``replication`` capability before it calls the factory). ``replicated`` is called on a
    slave after each chunk it appended; ``truncated`` after the slave cut its log back to where it
    agrees with its master (the broker then rebuilds the state it follows from the log).
    ``failover``: the cluster's election picks the master (``[broker] failover``); the broker
    then starts as a slave that follows no master until told which (:class:`FailoverReplication`).

    Consumer progress of a slave's own readers (consumers read from a slave while no master of
    its name is up; its log stays a copy, so that progress is in its memory only): a slave calls
    ``handover`` as it connects to a master and sends what it returns along (empty: nothing to
    hand over; ``handed_over`` once the master took it); a master calls ``adopt`` with what a
    slave handed over and the log offset up to which both logs agree, which moves its consumers
    forward to where the slave's readers got within that shared log (never back); it raises a
    PlugmqError when the broker cannot take it yet. All optional: without them the master delivers
    those messages again (at-least-once).
    """

    store: ReplicableStore | None = None
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    broker_id: int = 0
    replicated: Replicated | None = None
    truncated: Replicated | None = None
    failover: bool = False
    handover: Callable[[], ConsumerHandover] | None = None
    handed_over: Callable[[ConsumerHandover], None] | None = None
    adopt: Callable[[ConsumerHandover, int], int] | None = None


@runtime_checkable
class ReplicationService(Protocol):
    """A broker's side of master / slave replication (RocketMQ's HAService).

    On a master (``async_master`` or ``sync_master``) it accepts slaves, each of which reports the
    offset it holds; from there it streams the commit log (``ReplicableStore.read_log``) and
    keeps what each slave confirmed. A dead or slow slave never blocks an append: only the sends
    of a ``sync_master`` wait, in :meth:`await_replicated`. On a slave it connects to the master
    by itself (again after any failure, with a back-off), appends what arrives
    (``append_log``: whole chunks or nothing) and confirms its end offset after each chunk (with
    sync flush, after the chunk is durable). A torn transfer never leaves a torn record.
    """

    @property
    def capabilities(self) -> ReplicationCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def start(self) -> None:
        """Begin: a master listens for slaves, a slave connects to its master. Called once by the
        broker when it is assembled; returns without waiting for a peer."""

    def await_replicated(self, end_offset: int) -> SendStatus:
        """Wait until a slave confirmed the log up to ``end_offset`` (sync double-write).

        Called by the broker on a ``sync_master`` after each send was stored, on the sending
        thread. Returns SEND_OK once a slave confirmed it, SLAVE_NOT_AVAILABLE at once when no
        slave is connected and close enough to catch up, FLUSH_SLAVE_TIMEOUT when none confirmed
        it in the plugin's time limit (the message stays stored on the master). On an
        ``async_master`` it returns SEND_OK at once.
        """

    def status(self) -> ReplicationStatus:
        """Role, addresses, offsets, connected slaves and their lag (no blocking I/O)."""

    def close(self) -> None:
        """Stop listening / streaming and close connections. Idempotent."""


@runtime_checkable
class FailoverReplication(ReplicationService, Protocol):
    """A replication service whose broker changes role at run time (``capabilities.failover``).

    The broker calls these when its cluster's election says so (``plugmq.broker.failover``). Epochs
    fence: a log records where each master epoch began (RocketMQ 5's EpochFileCache), a slave
    whose log knows a newer epoch than a master's is refused by it, and a slave that holds records
    its new master never had (a returning old master) cuts them off in the handshake - its log
    then agrees with the new master's up to the point it follows from.
    """

    @property
    def epoch(self) -> int:
        """The newest master epoch this broker's log knows (0 before any election)."""

    def promote(self, epoch: int, role: BrokerRole) -> None:
        """Become the master for ``epoch`` (a master ``role``): stop following, note that ``epoch``
        begins at the log's end, accept slaves. Returns without waiting for a slave."""

    def follow(self, master: str) -> None:
        """Become (or stay) a slave of the master whose replication address is ``master``: stop
        serving slaves (sends waiting for one are answered), connect and copy its log."""

    @property
    def led_epoch(self) -> int:
        """The newest epoch this broker was itself master for (0 if none), kept across restarts."""

    @property
    def caught_up(self) -> bool:
        """Whether this broker may stand for master: it is the master, or a slave whose master
        last reported it within the plugin's in-sync gap (also after that master died)."""

    @property
    def master_address(self) -> str:
        """Where slaves reach this broker while it is master ("" while it is a slave)."""
