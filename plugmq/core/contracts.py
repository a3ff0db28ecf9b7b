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
    StoredMessage,
)
from plugmq.core.names import validate_broker_name, validate_cluster_name, validate_room
from plugmq.core.retention import RetentionFloor

__all__ = [
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
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    "Deliver",
    "Family",
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "Mastership",
    "MastershipListener",
    "MessageStore",
    "PluginContext",
    "PluginDeclaration",
    "StoreCapabilities",
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

    ``retention`` (None outside a broker) is the floor retention never cleans below: a store asks
    ``retention.lowest()`` for the lowest commit-log offset a consumer group or a service still
    needs; a service that keeps messages in the store registers what it needs with
    ``retention.hold(name, source)``.
    """

    broker_name: str
    data_dir: Path
    clock: Clock
    store_host: str = "127.0.0.1:10911"
    max_message_size: int = 4 * 1024 * 1024
    options: Mapping[str, Any] = attrs.field(factory=dict)
    retention: RetentionFloor | None = None

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

    The rules ``plugmq.conformance.delay`` checks (clause names in brackets):

    - Timing only through the context's clock (timers via ``clock.call_at``). Never early; late
      by at most ``capabilities.resolution_ms`` [never_early_and_late_by_at_most_one_tick].
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
      kill_right_after_a_write_back] — ``context.was_delivered`` settles the in-doubt one.
    - Overdue at start: what came due while the broker was down goes out at ``start()``,
      oldest first, within one resolution; ``metrics()`` reports ``overdue_at_start`` and a
      ``*late*max`` figure holding that lateness [overdue_at_start_oldest_first_and_in_metrics].
    - Three simulated days with a restart match a reference heap
      [three_simulated_days_match_a_reference_model].
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
        """Begin dispatching; deliver what came due while the broker was down, oldest first."""

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
        """Remove the strategy's files that are no longer needed (delay logs all delivered or
        cancelled, done segments); return how many were removed. Never removes anything still
        needed to deliver a pending message or to avoid a duplicate after a restart.

        Called by the broker every few seconds of its clock (RocketMQ's cleanResourceInterval).
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
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None


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

    @property
    def key(self) -> str:
        """``<broker name>.<broker id>``: unique in a cluster ("." never occurs in a broker name)."""
        return f"{self.broker_name}.{self.broker_id}"

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0 and self.role.is_master

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a name-service plugin stores, what ``--json`` output shows)."""
        return {
            "cluster": self.cluster, "broker_name": self.broker_name, "broker_id": self.broker_id,
            "endpoint": self.endpoint, "room": self.room, "role": self.role.value, "epoch": self.epoch,
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
                       default_queue_count=data.get("default_queue_count", 4), epoch=data.get("epoch", 0))
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
        """Publish this broker (replacing this service's earlier registration).

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
        """The latest snapshot of the live brokers and declared topics (no round trip)."""

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
