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
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    ConsumeQueueEntry,
    MessageQueue,
    StoredMessage,
)

__all__ = [
    "AllocateStrategy",
    "AllocateStrategyFactory",
    "AllocationCapabilities",
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    "Deliver",
    "Family",
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "MessageStore",
    "PluginContext",
    "PluginDeclaration",
    "StoreCapabilities",
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


@attrs.frozen
class PluginContext:
    """What a component factory gets: the broker's identity, its clock, where its files go.

    ``options`` maps plugin name -> that plugin's validated options object; a plugin reads its own
    with ``context.options_for("store_mmap")``. ``plugin_dir(name)`` is the directory a plugin
    owns under the broker's data dir (created on first use).
    """

    broker_name: str
    data_dir: Path
    clock: Clock
    store_host: str = "127.0.0.1:10911"
    max_message_size: int = 4 * 1024 * 1024
    options: Mapping[str, Any] = attrs.field(factory=dict)

    def options_for(self, plugin: str) -> Any:
        return self.options.get(plugin)

    def plugin_dir(self, plugin: str) -> Path:
        path = self.data_dir / plugin
        path.mkdir(parents=True, exist_ok=True)
        return path


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


@runtime_checkable
class MessageStore(Protocol):
    """A commit log with per-queue consume queues and indexes (RocketMQ's DefaultMessageStore).

    Thread-safe: appends and reads may come from many threads. Offsets: ``queue_offset`` is the
    dense 0-based index of a message in its (topic, queue); ``commit_log_offset`` is a store-wide
    position that, with the store host, forms the message id (one read finds the message).
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def append(self, request: AppendRequest) -> AppendResult:
        """Store one message; assign its queue offset, commit-log offset and store timestamp.

        Returns PUT_OK, or FLUSH_DISK_TIMEOUT when sync flush did not complete in time (the
        message is stored but not known durable). Raises StoreError (StoreFullError when the disk
        is above the critical watermark); a refused write leaves nothing behind.
        """

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Store several messages atomically where the engine allows (one flush covers all).

        Results are in request order; queue offsets are consecutive per queue.
        """

    def read(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message at ``commit_log_offset`` (``size`` is a hint), or None if there is none.

        Never returns a record that fails its integrity check.
        """

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        """Up to ``max_entries`` consume-queue entries from queue offset ``offset`` on, in order.

        Empty when ``offset`` is at or past the max offset. Reading entries never touches the
        commit log, so a broker-side pre-check can reject entries cheaply.
        """

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest queue offset still readable (0 until retention removes something)."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last queue offset written (0 for an empty or unknown queue)."""

    def queues(self) -> Mapping[str, int]:
        """Topic -> number of queues seen (highest queue id + 1), for recovery and admin."""

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        """Look a message up by its offset message id (one read); None if not found."""

    def query_by_key(
        self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose keys or unique id equal ``key``, stored in [begin, end]."""

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= ``timestamp_ms`` (max offset if none)."""

    def flush(self) -> None:
        """Make everything appended so far durable."""

    def clean_expired(self, now_ms: int) -> int:
        """Apply the retention policy; return how many segments/files were removed."""

    def stats(self) -> Mapping[str, float]:
        """Counters for metrics (bytes written, messages, flushes, ...)."""

    def close(self) -> None:
        """Stop background work, flush, and release files. Idempotent."""


# --------------------------------------------------------------------------------------------
# delay
# --------------------------------------------------------------------------------------------

Deliver = Callable[[AppendRequest], AppendResult]
"""The broker's write-back: stores a due message as a normal message on its real topic/queue."""


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

    ``deliver`` writes a due message to its real topic/queue. ``was_delivered`` answers, after a
    crash, whether a delivery whose completion was not recorded did reach the store, so a restart
    neither loses nor duplicates it.
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None
    was_delivered: WasDelivered | None = None


@runtime_checkable
class DelayScheduler(Protocol):
    """Holds delayed messages until due, then writes them back through ``context.deliver``.

    Timing only through the context's clock (timers via ``clock.call_at``). A due message is
    delivered with the request's real topic/queue and delay properties cleared, never early.
    """

    @property
    def capabilities(self) -> DelayCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        """Accept a delayed message durably. ``delay_level`` is set for a level request.

        Raises DelayUnsupportedError when the strategy cannot express the delay (and does not
        clamp). The returned msg_id is what ``cancel`` takes.
        """

    def start(self) -> None:
        """Begin dispatching; deliver what came due while the broker was down, oldest first."""

    def cancel(self, msg_id: str) -> bool:
        """Cancel a not-yet-due message; True if it will not be delivered. Strategies without the
        ``cancel`` capability raise DelayUnsupportedError."""

    def pending(self) -> int:
        """How many accepted messages are not delivered (or cancelled) yet."""

    def metrics(self) -> Mapping[str, float]:
        """Counters and lateness figures (e.g. delivered, late_ms_max, overdue_at_start)."""

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

    Optional extras a broker may use when present: ``precheck_many(codes)`` (a numpy bool mask
    over an int64 array of tag codes; must agree with ``precheck``) and ``precheck_bloom(bits)``
    (False only when a property the expression needs for TRUE is surely absent from a message
    whose property-name bloom is ``bits``).
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
        """What its filters offer the broker (e.g. a pre-check on consume-queue entries)."""

    def compile(self, expression: str) -> Filter:
        """Compile once per subscription. Raises FilterSyntaxError (with position) on bad input."""


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


@runtime_checkable
class AllocateStrategy(Protocol):
    """RocketMQ's AllocateMessageQueueStrategy: which queues one consumer of a group takes."""

    @property
    def name(self) -> str:
        """The strategy name; equal to the key of ``plugmq_allocate_strategies``."""

    @property
    def capabilities(self) -> AllocationCapabilities:
        """What the union of the consumers' answers covers."""

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
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None


TransactionChecker = Callable[[StoredMessage], TransactionDecision]
"""A producer group's check listener: given the half message (with its real topic and queue, the
transaction id as ``msg_id``), the state of its local transaction now."""


@runtime_checkable
class TransactionService(Protocol):
    """Half messages, decisions (an op log) and the check-back service.

    A decision is durable before it takes effect, takes effect at most once (a second commit or
    rollback of the same transaction changes nothing, also across a crash between recording and
    delivering) and a settled transaction is never checked again, also after a restart.
    """

    @property
    def capabilities(self) -> TransactionCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def prepare(self, request: AppendRequest, producer_group: str) -> AppendResult:
        """Store a half message for ``request`` (its real topic/queue), invisible to consumers.

        The returned ``msg_id`` is the transaction id that ``end`` takes. Raises TransactionError
        for a request the service cannot hold (e.g. a delayed one without that capability).
        """

    def end(self, msg_id: str, decision: TransactionDecision, *, from_check: bool = False) -> bool:
        """Record and apply a decision; False if the transaction was already settled.

        UNKNOWN records nothing (the check-back will ask) and returns whether it is still open.
        Raises TransactionError for an id that names no half message.
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

    def start(self) -> None:
        """Recover (finish recorded decisions, reload open transactions) and start checking."""

    def close(self) -> None:
        """Stop checking and persist state. Idempotent."""
