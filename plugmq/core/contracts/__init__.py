"""Component contracts: what each plugin family hands the broker, one module per family.

The hook specs (``plugmq.core.hookspecs``) say *when* a plugin is asked; these Protocols say
*what* the returned components must do. The modules follow the hookspec banners:
``declaration`` (the declaration and the contexts every factory gets), ``storage``, ``journal``
(a service's state in the commit log), ``delay``, ``filter``, ``allocation``, ``transaction``,
``cluster``, ``replication``, ``leadership`` (what an elected master holds: its lease, its in-sync set, the commit point) and ``events`` (what observers get). This package exports every name
of them.

Capabilities are frozen attrs values a plugin declares so the broker and the conformance suite
can tell a missing feature from a broken one. Optional features of a component are small
``runtime_checkable`` Protocols in its family's module, checked with ``isinstance``
(``isinstance(store, QueueRepairing)``), never by probing attributes. Each family's conformance
suite (``plugmq.conformance``) checks exactly the rules written here.

Data members of a Protocol (``capabilities``, ``name``, ``expression_type``, ...) are declared as
read-only properties: an implementation may provide them as a class attribute, an instance
attribute, an attrs field or a property, and type-checks as the Protocol either way. The core
only reads them.
"""

from __future__ import annotations

from plugmq.core.contracts.allocation import (
    AllocateStrategy,
    AllocateStrategyFactory,
    AllocationCapabilities,
)
from plugmq.core.contracts.cluster import (
    BrokerRegistration,
    BrokerRole,
    ClusterContext,
    ClusterListener,
    ClusterService,
    ClusterTopic,
    ClusterView,
    Mastership,
    MastershipListener,
    TopicPermission,
    TopicRegistration,
    TopicUndeclaring,
)
from plugmq.core.contracts.declaration import (
    SYSTEM_RECORD_HEADROOM,
    CleansExpired,
    Family,
    PluginContext,
    PluginDeclaration,
)
from plugmq.core.contracts.delay import (
    DelayCapabilities,
    DelayContext,
    DelayScheduler,
    Deliver,
    DeliverBatch,
    ReschedulableDelay,
    WasDelivered,
)
from plugmq.core.contracts.events import SystemTopicWriter
from plugmq.core.contracts.filter import (
    BatchPrecheck,
    BloomPrecheck,
    DescribedFilter,
    Filter,
    FilterCapabilities,
    FilterCompiler,
    FilterExample,
    FilterSample,
    MatchAll,
    PropertyRequirements,
)
from plugmq.core.contracts.journal import (
    JournalReplay,
    StateJournal,
)
from plugmq.core.contracts.leadership import (
    CommitPointReplication,
    Eligibility,
    InSyncCluster,
    InSyncSet,
    Leadership,
    LocalLeadership,
)
from plugmq.core.contracts.replication import (
    ClusterKeys,
    ConsumerHandover,
    FailoverReplication,
    LaneProgress,
    ReplicaStatus,
    Replicated,
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationService,
    ReplicationStatus,
)
from plugmq.core.contracts.storage import (
    BulkReading,
    ColumnAppending,
    DirectAppending,
    FlushMode,
    LogChunk,
    LogListener,
    LogPositioned,
    MessageStore,
    QueuePreparing,
    QueueRepairing,
    QueueRunReading,
    RecoveryFigures,
    RecoveryReporting,
    ReplicableStore,
    StoreCapabilities,
    has_capability,
    read_entries,
)
from plugmq.core.contracts.transaction import (
    TransactionCapabilities,
    TransactionChecker,
    TransactionContext,
    TransactionDecision,
    TransactionService,
)

__all__ = [
    "SYSTEM_RECORD_HEADROOM",
    "AllocateStrategy",
    "AllocateStrategyFactory",
    "AllocationCapabilities",
    "BatchPrecheck",
    "BloomPrecheck",
    "BrokerRegistration",
    "BrokerRole",
    "BulkReading",
    "CleansExpired",
    "ClusterContext",
    "ClusterKeys",
    "ClusterListener",
    "ClusterService",
    "ClusterTopic",
    "ClusterView",
    "ColumnAppending",
    "CommitPointReplication",
    "ConsumerHandover",
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    "Deliver",
    "DeliverBatch",
    "DescribedFilter",
    "DirectAppending",
    "Eligibility",
    "FailoverReplication",
    "Family",
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "FilterExample",
    "FilterSample",
    "FlushMode",
    "InSyncCluster",
    "InSyncSet",
    "JournalReplay",
    "LaneProgress",
    "Leadership",
    "LocalLeadership",
    "LogChunk",
    "LogListener",
    "LogPositioned",
    "Mastership",
    "MastershipListener",
    "MatchAll",
    "MessageStore",
    "PluginContext",
    "PluginDeclaration",
    "PropertyRequirements",
    "QueuePreparing",
    "QueueRepairing",
    "QueueRunReading",
    "RecoveryFigures",
    "RecoveryReporting",
    "ReplicaStatus",
    "ReplicableStore",
    "Replicated",
    "ReplicationCapabilities",
    "ReplicationContext",
    "ReplicationService",
    "ReplicationStatus",
    "ReschedulableDelay",
    "StateJournal",
    "StoreCapabilities",
    "SystemTopicWriter",
    "TopicPermission",
    "TopicRegistration",
    "TopicUndeclaring",
    "TransactionCapabilities",
    "TransactionChecker",
    "TransactionContext",
    "TransactionDecision",
    "TransactionService",
    "WasDelivered",
    "has_capability",
    "read_entries",
]
