"""What the server and admin use of a broker: Protocols the Broker facade implements.

Like clients (plugmq.client.ports), ``plugmq serve`` and the admin verbs are written against
these, not against :class:`plugmq.broker.broker.Broker`; mypy checks that the Broker implements
each where one is handed over. They live with the runtime, not in plugmq.admin, because the
server must not load the admin verbs before its first admin call.

=================  ==================================================================
port               used by
=================  ==================================================================
``Administered``   the admin verbs (``plugmq.admin.BrokerAdmin``, ``plugmq.admin.insight``)
``Serving``        the gRPC MessagingService and its send pipeline
``Electable``      failover (``plugmq.broker.failover``)
``Served``         ``plugmq serve`` as a whole: all of the above, the cluster session,
                   routes, metrics and the admin endpoint
=================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from plugmq.broker.commit import CommitGate
from plugmq.broker.groups import GroupRegistry
from plugmq.broker.offsets import ConsumerOffsets, OffsetStore
from plugmq.broker.pop import PopService
from plugmq.broker.ratelimit import RateLimiter
from plugmq.broker.topicdelete import TopicDeletion
from plugmq.broker.topics import TopicTable
from plugmq.broker.traffic import Traffic
from plugmq.client.ports import Sending, TransactionSending
from plugmq.config.broker import BrokerConfig
from plugmq.config.policy import GroupPolicy
from plugmq.core.clock import Clock
from plugmq.core.contracts import (
    AllocateStrategyFactory,
    BrokerRole,
    ClusterService,
    DelayScheduler,
    Filter,
    FilterCompiler,
    MessageStore,
    ReplicationService,
    TransactionService,
)
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.message import AppendResult, MessageQueue, SendStatus, StoredMessage

__all__ = ["Administered", "Electable", "Served", "Serving"]


class _Identity(Protocol):
    name: str
    config: BrokerConfig
    clock: Clock
    replication: ReplicationService | None

    @property
    def role(self) -> BrokerRole:
        """The role the broker plays now."""
        ...

    @property
    def epoch(self) -> int:
        """The newest master epoch its log knows (0 without failover)."""
        ...


class _Services(Protocol):
    @property
    def delay(self) -> DelayScheduler | None:
        ...

    @property
    def transactions(self) -> TransactionService | None:
        ...

    def group_policy(self, group: str) -> GroupPolicy:
        ...


class Administered(_Identity, _Services, Sending, Protocol):
    """What the admin verbs read and change of one broker."""

    data_dir: Path
    store: MessageStore
    topics: TopicTable
    consumer_offsets: ConsumerOffsets
    groups: GroupRegistry
    pop: PopService
    traffic: Traffic

    def create_topic(self, topic: str, queue_count: int | None = None) -> list[MessageQueue]:
        ...

    def offsets(self, group: str, member: str | None = None) -> OffsetStore:
        ...

    def acked_by_epoch(self) -> dict[int, int]:
        """Sends this broker answered OK itself, by the master epoch it held then."""
        ...

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        ...

    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        ...

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        ...

    def offset_for_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> int:
        ...

    def min_offset(self, queue: MessageQueue) -> int:
        ...

    def max_offset(self, queue: MessageQueue) -> int:
        ...

    def report_redriven(self, group: str, message: StoredMessage, copy_msg_id: str, topic: str) -> None:
        """A dead letter was sent back (``resend-dlq``): the re-driven event."""
        ...

    def delete_group(self, group: str) -> int:
        ...

    def delete_topic(self, topic: str, *, group_topic: bool = False) -> TopicDeletion:
        ...

    def wait_for_messages(self, timeout: float) -> None:
        """Block until messages arrive or ``timeout`` real seconds passed."""
        ...

    @property
    def rate_limits(self) -> RateLimiter:
        ...

    def cancel_delayed(self, msg_id: str) -> bool:
        ...

    def reschedule_delayed(self, msg_id: str, deliver_at_ms: int) -> AppendResult | None:
        ...


class Serving(_Services, Sending, TransactionSending, Protocol):
    """What the gRPC MessagingService uses: sends, pop consumption, filters, delay cancels."""

    clock: Clock
    filters: dict[str, FilterCompiler]
    pop: PopService

    @property
    def promoted_at(self) -> float | None:
        """When (monotonic seconds) this broker last became master by election; None if never."""
        ...

    def count_acked(self, sends: int) -> None:
        """The server answered ``sends`` sends OK as this broker (reported by epoch)."""
        ...

    def count_duplicate(self, topic: str) -> None:
        """The server answered a client's retry with the copy an earlier try stored (traffic)."""
        ...

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        ...

    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        ...

    def cancel_delayed(self, msg_id: str) -> bool:
        ...

    def is_priority_topic(self, topic: str) -> bool:
        """Whether ``topic`` takes priority messages (``[topics.<t>] priority``)."""
        ...

    def check_writable(self, action: str = ...) -> None:
        """ReadOnlyBrokerError on a slave."""
        ...

    def await_replication(self, end_offset: int | None = None) -> SendStatus:
        """A sync_master's wait for a slave (SEND_OK elsewhere)."""
        ...

    @property
    def sends_wait(self) -> bool:
        """Whether a normal send may block on I/O (sync flush, replication): then off the loop."""
        ...

    @property
    def pop_waits(self) -> bool:
        """Whether a pop ack may block on I/O (its journal flushed or replicated): then off the loop."""
        ...


class Electable(_Identity, Protocol):
    """What failover changes of a broker as its cluster's election moves the master."""

    def promote(self, epoch: int, leadership: Leadership | None = None) -> None:
        ...

    def demote(self, master: str | None) -> None:
        ...

    def follow(self, master: str) -> None:
        ...


class Served(Serving, Administered, Electable, Protocol):
    """A broker as ``plugmq serve`` serves it."""

    cluster: ClusterService | None
    strategies: dict[str, AllocateStrategyFactory]
    arrival_listeners: list[Callable[[], None]]

    @property
    def commit(self) -> CommitGate:
        """What the replication plugin's commit point means here (a fenced master forwards)."""
        ...

    def add_observer(self, observer: object, name: str) -> None:
        """Register an observer's event hooks (metrics) as ``name``."""
        ...

    def remove_observer(self, name: str) -> None:
        ...
