"""The plugmq plugin SPI: what a plugin author imports.

``__all__`` is the plugin-author surface: the hook markers, each family's contract, the value
types that cross the plugin boundary, the errors a plugin raises most, the clock and the logger.
Everything else of the SPI lives in its module: every contract and optional capability in
``plugmq.core.contracts`` (one module per hook family), every error class in
``plugmq.core.errors``, names and system topics in ``plugmq.core.names``, the hook specifications
in ``plugmq.core.hookspecs``.

Names that this package exported before and no longer does still import from here, with a
DeprecationWarning naming their module (``_MOVED_NAMES``). The broker runtime is
``plugmq.broker``, the clients ``plugmq.client``, configuration ``plugmq.config``, operations
``plugmq.admin``, code plugins share ``plugmq.kit``; modules that used to live here under those
names still import from their old paths (``plugmq.core._moved``), with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from plugmq.core import _moved
from plugmq.core.clock import Clock, ManualClock
from plugmq.core.contracts.allocation import AllocateStrategy, AllocateStrategyFactory, AllocationCapabilities
from plugmq.core.contracts.cluster import BrokerRegistration, BrokerRole, ClusterContext, ClusterService, ClusterView
from plugmq.core.contracts.declaration import Family, PluginContext, PluginDeclaration
from plugmq.core.contracts.delay import DelayCapabilities, DelayContext, DelayScheduler
from plugmq.core.contracts.events import SystemTopicWriter
from plugmq.core.contracts.filter import Filter, FilterCapabilities, FilterCompiler, FilterExample, FilterSample
from plugmq.core.contracts.journal import StateJournal
from plugmq.core.contracts.replication import (
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationService,
    ReplicationStatus,
)
from plugmq.core.contracts.storage import LogChunk, MessageStore, ReplicableStore, StoreCapabilities
from plugmq.core.contracts.transaction import (
    TransactionCapabilities,
    TransactionContext,
    TransactionDecision,
    TransactionService,
)
from plugmq.core.errors import (
    ConfigError,
    CorruptRecordError,
    DelayUnsupportedError,
    FilterEvaluationError,
    FilterSyntaxError,
    PlugmqError,
    StoreError,
    TransactionError,
    ValidationError,
)
from plugmq.core.hashing import tags_code
from plugmq.core.hookspecs import hookimpl, hookspec
from plugmq.core.logs import get_logger
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ConsumeQueueEntry,
    Message,
    MessageQueue,
    SendStatus,
    StoredMessage,
    encode_msg_id,
)
from plugmq.core.names import Prop, validate_topic

_moved.install()

__all__ = [  # noqa: RUF022 - grouped by family, as a plugin author reads it
    # hook markers
    "hookimpl",
    "hookspec",
    # clock and logging
    "Clock",
    "ManualClock",
    "get_logger",
    # declaration and contexts
    "Family",
    "PluginContext",
    "PluginDeclaration",
    # storage
    "LogChunk",
    "MessageStore",
    "ReplicableStore",
    "StoreCapabilities",
    "StateJournal",
    # delay
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    # filter
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "FilterExample",
    "FilterSample",
    # allocation
    "AllocateStrategy",
    "AllocateStrategyFactory",
    "AllocationCapabilities",
    # transaction
    "TransactionCapabilities",
    "TransactionContext",
    "TransactionDecision",
    "TransactionService",
    # events
    "SystemTopicWriter",
    # cluster and replication
    "BrokerRegistration",
    "BrokerRole",
    "ClusterContext",
    "ClusterService",
    "ClusterView",
    "ReplicationCapabilities",
    "ReplicationContext",
    "ReplicationService",
    "ReplicationStatus",
    # value types
    "AppendRequest",
    "AppendResult",
    "AppendStatus",
    "ConsumeQueueEntry",
    "Message",
    "MessageQueue",
    "Prop",
    "SendStatus",
    "StoredMessage",
    "encode_msg_id",
    "tags_code",
    "validate_topic",
    # errors (every error class: plugmq.core.errors)
    "ConfigError",
    "CorruptRecordError",
    "DelayUnsupportedError",
    "FilterEvaluationError",
    "FilterSyntaxError",
    "PlugmqError",
    "StoreError",
    "TransactionError",
    "ValidationError",
]

#: Names this package exported before this round, and the module that holds each now.
_MOVED_NAMES: dict[str, str] = {
    "SystemClock": "plugmq.core.clock",
    "Timer": "plugmq.core.clock",
    "ClusterListener": "plugmq.core.contracts.cluster",
    "ClusterTopic": "plugmq.core.contracts.cluster",
    "Mastership": "plugmq.core.contracts.cluster",
    "MastershipListener": "plugmq.core.contracts.cluster",
    "TopicPermission": "plugmq.core.contracts.cluster",
    "TopicRegistration": "plugmq.core.contracts.cluster",
    "SYSTEM_RECORD_HEADROOM": "plugmq.core.contracts.declaration",
    "Deliver": "plugmq.core.contracts.delay",
    "DeliverBatch": "plugmq.core.contracts.delay",
    "WasDelivered": "plugmq.core.contracts.delay",
    "JournalReplay": "plugmq.core.contracts.journal",
    "ConsumerHandover": "plugmq.core.contracts.replication",
    "FailoverReplication": "plugmq.core.contracts.replication",
    "ReplicaStatus": "plugmq.core.contracts.replication",
    "Replicated": "plugmq.core.contracts.replication",
    "FlushMode": "plugmq.core.contracts.storage",
    "LogListener": "plugmq.core.contracts.storage",
    "QueuePreparing": "plugmq.core.contracts.storage",
    "TransactionChecker": "plugmq.core.contracts.transaction",
    "DEFAULT_DELAY_LEVELS": "plugmq.core.delaylevels",
    "DEFAULT_DELAY_LEVELS_MS": "plugmq.core.delaylevels",
    "parse_delay_levels": "plugmq.core.delaylevels",
    "AllocationError": "plugmq.core.errors",
    "ClientError": "plugmq.core.errors",
    "ClusterError": "plugmq.core.errors",
    "DelayError": "plugmq.core.errors",
    "DescriptorLimitError": "plugmq.core.errors",
    "FilterError": "plugmq.core.errors",
    "InvalidNameError": "plugmq.core.errors",
    "MessageTooLargeError": "plugmq.core.errors",
    "PluginCardinalityError": "plugmq.core.errors",
    "PluginError": "plugmq.core.errors",
    "ReadOnlyBrokerError": "plugmq.core.errors",
    "ReceiptHandleError": "plugmq.core.errors",
    "ReplicationError": "plugmq.core.errors",
    "StoreFullError": "plugmq.core.errors",
    "TopicError": "plugmq.core.errors",
    "TAG_SEPARATOR": "plugmq.core.hashing",
    "java_string_hash": "plugmq.core.hashing",
    "split_tags": "plugmq.core.hashing",
    "PROJECT_NAME": "plugmq.core.hookspecs",
    "DEFAULT_MAX_BODY_SIZE": "plugmq.core.message",
    "PullResult": "plugmq.core.message",
    "PullStatus": "plugmq.core.message",
    "SendResult": "plugmq.core.message",
    "SendResults": "plugmq.core.message",
    "SysFlag": "plugmq.core.message",
    "check_body_size": "plugmq.core.message",
    "decode_msg_id": "plugmq.core.message",
    "new_unique_id": "plugmq.core.message",
    "DLQ_PREFIX": "plugmq.core.names",
    "RETRY_PREFIX": "plugmq.core.names",
    "SCHEDULE_TOPIC": "plugmq.core.names",
    "TRACE_TOPIC": "plugmq.core.names",
    "TRANS_DISCARD_TOPIC": "plugmq.core.names",
    "TRANS_HALF_TOPIC": "plugmq.core.names",
    "TRANS_OP_TOPIC": "plugmq.core.names",
    "dlq_topic": "plugmq.core.names",
    "is_system_topic": "plugmq.core.names",
    "retry_topic": "plugmq.core.names",
    "validate_group": "plugmq.core.names",
    "RetentionFloor": "plugmq.core.retention",
}


def __getattr__(name: str) -> Any:
    """A name dropped from ``__all__``: still here for a transition, with a DeprecationWarning."""
    module = _MOVED_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"plugmq.core.{name} is deprecated: import it from {module}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)
