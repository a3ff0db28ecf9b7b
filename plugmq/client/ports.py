"""What clients use of a broker: small Protocols, one per kind of client.

Producers, consumers and the transaction producer are written against these, not against
:class:`plugmq.broker.broker.Broker`, so the data flows one way: the broker builds clients and
hands itself over as the port they need; no client module imports the runtime (an import-linter
contract keeps it so). The Broker implements every port (mypy checks it where it builds each
client). What the server and admin use of a broker is in ``plugmq.broker.ports``.

=====================  ==========================================================
port                   used by
=====================  ==========================================================
``Sending``            Producer (``Requesting`` for its request-reply)
``TransactionSending`` TransactionProducer
``Reading``            PullConsumer (with ``QueueOffsets``)
``GroupConsuming``     PushConsumer (a ``GroupMember`` of its group)
``Subscribing``        SimpleConsumer (with ``PopConsuming``)
=====================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from plugmq.client.values import PendingReply, ReceivedMessage
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.clock import Clock
from plugmq.core.contracts import AllocateStrategy, Filter, TransactionService
from plugmq.core.message import AppendRequest, Message, MessageQueue, PullResult, SendResult, StoredMessage
from plugmq.core.modes import ConsumeFrom

__all__ = [
    "GroupConsuming",
    "GroupMember",
    "PopConsuming",
    "QueueOffsets",
    "Reading",
    "Requesting",
    "Sending",
    "Stoppable",
    "Subscribing",
    "TopicRouting",
    "TransactionSending",
]


class QueueOffsets(Protocol):
    """One owner's committed offsets (a clustering group, or one member of a broadcasting group)."""

    def read(self, queue: MessageQueue) -> int | None:
        """The offset committed for ``queue`` (None: never)."""
        ...

    def update(self, queue: MessageQueue, offset: int, *, persist: bool = True) -> None:
        """Record that everything before ``offset`` of ``queue`` was consumed (``persist``: commit now)."""
        ...

    def persist(self) -> None:
        """Commit what changed since the last commit, as one record."""
        ...


class GroupMember(Protocol):
    """What the broker's group registry needs of a clustering consumer."""

    group: str
    client_id: str
    room: str | None  # its machine room, as configured (room strategies)

    def topics_to_balance(self) -> list[str]: ...

    def target_queues(self, topic: str, queues: list[MessageQueue], members: list[str]) -> list[MessageQueue]: ...

    def release_queues(self, queues: set[MessageQueue]) -> None: ...

    def take_queues(self, queues: set[MessageQueue]) -> None: ...

    def owned_queues(self) -> set[MessageQueue]: ...


class PopConsuming(Protocol):
    """Pop consumption as a simple consumer uses it (the broker's PopService)."""

    def receive(self, group: str, topic: str, subscription: Filter | None, max_messages: int, invisible_ms: int,
                *, consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET,
                consume_timestamp_ms: int | None = None, only_queue: int | None = None,
                client_id: str = "", account: str | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` of ``topic`` for ``group``, each invisible for ``invisible_ms``
        (``client_id``: the receiving client, for the delivered events; ``account``: its rate limit)."""
        ...

    def ack(self, group: str, topic: str, receipt_handle: str, *, client_id: str = "") -> None:
        ...

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str, invisible_ms: int,
                                  *, gave_up: bool = False, client_id: str = "") -> str:
        """Move the message's invisible deadline; returns its new receipt handle."""
        ...


class TopicRouting(Protocol):
    def topic_queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]:
        """The queues of ``topic`` (auto-created when the broker allows it and ``create`` is not False)."""
        ...


class Sending(TopicRouting, Protocol):
    def put(self, message: Message, queue_id: int, *, allow_system_topic: bool = False, reconsume_times: int = 0,
            extra_properties: Mapping[str, str] | None = None, await_slave: bool = True,
            account: str | None = None) -> SendResult:
        """Store one message on a queue of its topic (delayed ones go to the delay plugin)."""
        ...

    def put_batch(self, messages: Sequence[Message], queue_id: int, *,
                  extra_properties: Sequence[Mapping[str, str] | None] | None = None,
                  await_slave: bool = True, account: str | None = None) -> Sequence[SendResult]:
        """Store messages of one topic on one queue in one store batch."""
        ...


class Requesting(Sending, Protocol):
    """What a producer's request-reply uses: the reply topic, and a wait for one reply."""

    clock: Clock

    @property
    def reply_cluster(self) -> str:
        """The cluster (or broker) whose ``<it>_REPLY_TOPIC`` replies to requests sent here go to."""
        ...

    def expect_reply(self, correlation_id: str) -> PendingReply:
        """Register a wait for the reply with ``correlation_id`` (before the request is sent)."""
        ...

    def forget_reply(self, correlation_id: str) -> None:
        """Stop waiting (the request timed out or failed)."""
        ...


class TransactionSending(TopicRouting, Protocol):
    name: str

    @property
    def transactions(self) -> TransactionService | None:
        """The transaction plugin's service (None without one)."""
        ...

    def build_request(self, message: Message, queue_id: int, *, reconsume_times: int = 0,
                      extra_properties: Mapping[str, str] | None = None, sys_flag: int = 0,
                      born_host: str = "127.0.0.1:0") -> AppendRequest:
        """The store request for a message (system properties filled in), for the transaction plugin."""
        ...


class Reading(TopicRouting, Protocol):
    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, subscription: Filter | None = None, *,
             consumer_group: str = "", client_id: str = "") -> PullResult:
        ...

    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        ...

    def offsets(self, group: str, member: str | None = None) -> QueueOffsets:
        """The broker-kept offsets of a clustering group (of one member of a broadcasting group)."""
        ...


class Stoppable(Protocol):
    def shutdown(self) -> None:
        ...


class GroupConsuming(Reading, Protocol):
    name: str
    clock: Clock

    @property
    def delay_available(self) -> bool:
        """Whether delayed messages (and so retries through ``%RETRY%<group>``) are possible."""
        ...

    def group_policy(self, group: str) -> GroupPolicy:
        ...

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None) -> int:
        """Where the group starts on a queue it has no position on."""
        ...

    def allocation_strategy(self, name: str, params: Mapping[str, Any] | None = None, *,
                            group: str | None = None) -> AllocateStrategy:
        ...

    def create_topic(self, topic: str, queue_count: int | None = None) -> list[MessageQueue]:
        ...

    def join_group(self, member: GroupMember) -> None:
        ...

    def leave_group(self, member: GroupMember) -> None:
        ...

    def heartbeat(self, group: str, client_id: str) -> bool:
        """Record a member's heartbeat; False if it was dropped and must join again."""
        ...

    def report_acked(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        """The listener consumed ``messages`` successfully (the acked event)."""
        ...

    def send_back(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """Retry ``message`` later through ``%RETRY%<group>``, or dead-letter it, as ``policy`` says."""
        ...

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        ...

    def register_consumer(self, consumer: Stoppable) -> None:
        """Shut ``consumer`` down when the broker closes."""
        ...

    def unregister_consumer(self, consumer: Stoppable) -> None:
        ...

    def wake_consumers(self) -> None:
        ...

    def wait_for_messages(self, timeout: float) -> None:
        ...


class Subscribing(TopicRouting, Protocol):
    clock: Clock

    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        ...

    def wait_for_messages(self, timeout: float) -> None:
        ...
