"""The broker: one object over the parts a plugin list assembles (plugmq.broker.assembly).

``Broker`` is a facade: sending (plugmq.broker.sending), reads (reads), redelivery, roles and
replication hooks (roles), the delay and transaction services (services), their write-back
(writeback), pop consumption (pop), retention and the lifecycle each live in a module of their
own. Data flows one way: the broker builds its clients (producers, push / pull / simple
consumers, the transaction producer) and hands itself to them as the port each needs
(plugmq.client.ports); no client module imports this one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plugmq.broker.assembly import assemble
from plugmq.broker.commit import CommitGate
from plugmq.broker.dedup import DedupWindows
from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.offsets import OffsetStore
from plugmq.broker.ratelimit import RateLimiter
from plugmq.broker.topicdelete import TopicDeletion, check_deletable, delete_topic
from plugmq.client.consumer import PullConsumer, PushConsumer
from plugmq.client.ports import GroupMember, Stoppable
from plugmq.client.producer import Producer
from plugmq.client.simple import FilterExpression, SimpleConsumer
from plugmq.client.transactions import LocalTransaction, TransactionProducer
from plugmq.client.values import PendingReply
from plugmq.config.broker import DEFAULT_PLUGINS, BrokerConfig, load_config
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts import (
    AllocateStrategy,
    BrokerRole,
    DelayScheduler,
    Filter,
    FlushMode,
    TopicUndeclaring,
    TransactionChecker,
    TransactionService,
)
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.errors import ClientError, TopicError
from plugmq.core.logs import get_logger
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    Message,
    MessageQueue,
    PullResult,
    SendResult,
    SendStatus,
    StoredMessage,
)
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import validate_group

__all__ = ["Broker"]

log = get_logger(__name__)


class Broker:
    """One broker: a store, optional delay and transaction services, filters and strategies.

    Build it with :meth:`open` or :meth:`from_config`; use it as a context manager or call
    :meth:`close`, which stops background services and flushes the store.
    """

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None,
                 plugin_objects: Mapping[str, object] | None = None) -> None:
        parts = self._parts = assemble(config, clock or SystemClock(), plugin_objects)
        self.config = config
        self.name = config.name
        self.clock: Clock = parts.clock
        self.data_dir = Path(config.data_dir)
        self.plugins = parts.plugins
        self.store = parts.store
        self.filters = parts.filters
        self.strategies = parts.strategies
        self.topics = parts.topics.table
        self.groups = parts.groups
        self.journals = parts.journals
        self.consumer_offsets = parts.consumer_offsets
        self.delay_ledger: DelayLedger | None = parts.delay_ledger
        self.replication = parts.replication
        self.pop = parts.pop
        self.retention = parts.retention
        self.retention_floor = parts.retention_floor
        self.cluster = parts.cluster
        self.traffic = parts.traffic  # messages in/out and append latency, for metrics
        # Called (in the storing thread) whenever consumers are woken: messages stored, or visible
        # again. Cheaper than a message_stored hook for who only needs to know that (plugmq serve).
        self.arrival_listeners: list[Callable[[], None]] = parts.arrivals.listeners
        log.info("broker started", broker=self.name, plugins=list(config.plugins), data_dir=str(self.data_dir))
        parts.events.started(parts.writeback)  # observers write their system topics through it

    # ------------------------------------------------------------------------------ assembly
    @classmethod
    def open(
        cls,
        data_dir: str | Path = "./data",
        *,
        plugins: Sequence[str] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        clock: Clock | None = None,
        name: str = "broker-a",
        plugin_objects: Mapping[str, object] | None = None,
        groups: Mapping[str, Any] | None = None,
        topics: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        **broker_settings: Any,
    ) -> Broker:
        """Assemble a broker in ``data_dir`` from plugin names (default set when None).

        ``options`` are the plugins' tables (``[plugins.<name>]``), ``groups`` the ``[groups]``
        table (defaults as keys, one table or :class:`GroupPolicy` per group), ``topics`` the
        ``[topics]`` table (dedup, priority), ``limits`` the ``[limits]`` table (rate limits),
        ``broker_settings`` the rest of ``[broker]``.
        """
        mapping: dict[str, Any] = {
            "broker": {"name": name, "data_dir": str(data_dir),
                       "plugins": list(plugins if plugins is not None else DEFAULT_PLUGINS), **broker_settings},
            "plugins": dict(options or {}),
            "groups": dict(groups or {}),
            "topics": dict(topics or {}),
            "limits": dict(limits or {}),
        }
        return cls(load_config(mapping), clock=clock, plugin_objects=plugin_objects)

    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any], *, clock: Clock | None = None) -> Broker:
        """Assemble a broker from a TOML file path or an equivalent mapping."""
        return cls(load_config(source), clock=clock)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def broker_dir(self) -> Path:
        """Where the broker keeps its own state (topics, consumer offsets)."""
        path = self.data_dir / "broker"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        """Stop background services, persist their state, flush and close the store. Idempotent.

        A step that fails (say, a full disk while the offsets are persisted) is logged and the
        rest still run, so the store is always closed; the first failure is raised at the end."""
        self._parts.lifecycle.close()

    # ------------------------------------------------------------------------------ services
    @property
    def delay(self) -> DelayScheduler | None:
        """The delay plugin's scheduler (None without one)."""
        return self._parts.services.delay

    @property
    def transactions(self) -> TransactionService | None:
        """The transaction plugin's service (None without one)."""
        return self._parts.services.transactions

    @property
    def delay_available(self) -> bool:
        """Whether a delay plugin is assembled (delayed sends, and retries through %RETRY%)."""
        return self.delay is not None

    def cancel_delayed(self, msg_id: str) -> bool:
        """Cancel a not-yet-due delayed message by the msg_id its send returned."""
        self._parts.lifecycle.check_open()
        return self._parts.services.cancel_delayed(msg_id, self.delay_ledger)

    def reschedule_delayed(self, msg_id: str, deliver_at_ms: int) -> AppendResult | None:
        """Move a not-yet-due delayed message (by the msg_id its send returned) to ``deliver_at_ms``
        (epoch ms). Returns its new result, whose msg_id replaces the old one (for a later cancel
        or reschedule), or None when no pending message has that id (delivered, cancelled, moved
        before, unknown). DelayUnsupportedError where the delay plugin cannot reschedule."""
        self._parts.lifecycle.check_open()
        return self._parts.services.reschedule_delayed(msg_id, deliver_at_ms, self.delay_ledger)

    def add_observer(self, observer: object, name: str) -> None:
        """Register ``observer``'s event hook implementations (a metrics exporter) as ``name``."""
        self._parts.events.add_observer(observer, name)

    def remove_observer(self, name: str) -> None:
        """Unregister the observer registered as ``name`` (nothing if there is none)."""
        self._parts.events.remove_observer(name)

    # ------------------------------------------------------------------------------ topics
    def create_topic(self, topic: str, queue_count: int | None = None) -> list[MessageQueue]:
        """Create (or grow) a topic; returns its queues."""
        return self._parts.topics.create(topic, queue_count)

    def delete_topic(self, topic: str, *, group_topic: bool = False) -> TopicDeletion:
        """Delete ``topic`` as RocketMQ's ``deleteTopic`` does: it leaves the table and the routes,
        every group's offsets, pop progress and in-flight messages on it are forgotten; its
        records stay in the store until retention but are never served again, also not by a
        topic created later under the name (plugmq.broker.topicdelete says what is refused and
        why). Journaled: replicated, replayed at start, followed by slaves."""
        self._parts.lifecycle.check_open()
        self.check_writable("delete topics")
        check_deletable(topic, group_topic=group_topic)
        if self.cluster is not None and topic in self.cluster.view().topics:
            # Declared for the cluster: its masters would create it again from the declaration, so
            # the declaration goes first; plugmq serve's cluster members then delete their copies.
            if not isinstance(self.cluster, TopicUndeclaring):
                raise TopicError(f"topic {topic!r} is declared for cluster {self.config.cluster_name!r}, and its "
                                 f"cluster plugin cannot remove a declaration; delete it on a broker outside a "
                                 "cluster only")
            self.cluster.undeclare_topic(topic)
            log.info("topic declaration removed from the cluster", topic=topic, cluster=self.config.cluster_name)
            if self.topics.get(topic) is None:  # declared, never created here: nothing to delete locally
                return TopicDeletion(topic, 0, {}, (), 0)
        parts = self._parts
        deletion = delete_topic(parts.topics.table, self.store, self.consumer_offsets, self.pop, topic)
        status = self.await_replication()
        if status is not SendStatus.SEND_OK:
            log.warning("topic deletion not confirmed by a slave yet", topic=topic, status=status.value)
        return deletion

    def is_priority_topic(self, topic: str) -> bool:
        """Whether ``topic`` takes priority messages (``[topics.<t>] priority = true``): priority p
        is stored on queue min(p, queues - 1) and consumers get the highest queues first."""
        return self.config.topic_settings.settings(topic).priority

    def topic_queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]:
        """The queues of ``topic``; auto-creates it when allowed, else TopicError naming it."""
        return self._parts.topics.queues(topic, create=create)

    # ------------------------------------------------------------------------------ sending
    def build_request(self, message: Message, queue_id: int, *, reconsume_times: int = 0,
                      extra_properties: Mapping[str, str] | None = None, sys_flag: int = 0,
                      born_host: str = "127.0.0.1:0") -> AppendRequest:
        """Turn a producer's Message into the store's request (system properties filled in)."""
        return self._parts.sender.build_request(message, queue_id, reconsume_times=reconsume_times,
                                                extra_properties=extra_properties, sys_flag=sys_flag,
                                                born_host=born_host)

    def put(self, message: Message, queue_id: int, *, allow_system_topic: bool = False,
            reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
            await_slave: bool = True, account: str | None = None) -> SendResult:
        """Store one message on ``queue_id`` of its topic (delayed ones go to the delay plugin).

        On a ``sync_master`` the answer waits for a slave, unless ``await_slave`` is False: then the
        caller waits itself, once for many sends (``await_replication``), as ``plugmq serve`` does.
        ``account``: who sends, for its rate limit (plugmq serve's ACL account).
        """
        return self._parts.sender.put(message, queue_id, allow_system_topic, reconsume_times, extra_properties,
                                      await_slave, account)  # by position: cheaper on the hot path

    def put_batch(self, messages: Sequence[Message], queue_id: int, *,
                  extra_properties: Sequence[Mapping[str, str] | None] | None = None,
                  await_slave: bool = True, account: str | None = None) -> Sequence[SendResult]:
        """Store several messages of one topic on one queue in one store batch (``extra_properties``
        per message, ``await_slave`` and ``account`` as for :meth:`put`)."""
        return self._parts.sender.put_batch(messages, queue_id, extra_properties=extra_properties,
                                            await_slave=await_slave, account=account)

    def send_back(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """A consumer gave up on ``message`` for now: retry it later, or dead-letter it, as
        ``policy`` (default: the group's) says (plugmq.broker.redelivery)."""
        return self._parts.redelivery.send_back(message, group, policy)

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """Move ``message`` to the group's dead-letter topic; stored there, never dropped."""
        return self._parts.redelivery.dead_letter(message, group, policy)

    # ------------------------------------------------------------------------------ roles and replication
    @property
    def role(self) -> BrokerRole:
        """The role this broker plays now (a slave until elected, with failover)."""
        return self._parts.roles.role

    @property
    def master_role(self) -> BrokerRole:
        """The mode this broker works in whenever it is master."""
        return self._parts.roles.master_role

    @property
    def epoch(self) -> int:
        """The newest master epoch this broker's log knows (0 without failover)."""
        return self._parts.roles.epoch

    def promote(self, epoch: int, leadership: Leadership | None = None) -> None:
        """Become the master of this broker name for ``epoch`` (the election was won);
        ``leadership``: the win's lease and in-sync set, for the replication plugin."""
        self._parts.switch.promote(epoch, leadership)

    @property
    def promoted_at(self) -> float | None:
        """When (monotonic seconds) this broker last became master by election; None if never."""
        return self._parts.roles.promoted_at

    @property
    def commit(self) -> CommitGate:
        """What the replication plugin's commit point means here (plugmq.broker.commit)."""
        return self._parts.roles.commit

    def check_serving(self) -> None:
        """FencedError while this broker may hand out no messages (a failover slave, a master not
        sure it still leads)."""
        self._parts.roles.check_serving()

    def count_acked(self, sends: int) -> None:
        """The server answered ``sends`` sends OK as this broker (reported by epoch)."""
        self._parts.roles.count_acked(sends)

    def count_duplicate(self, topic: str) -> None:
        """The server answered a client's retry with the copy an earlier try stored (traffic)."""
        self.traffic.sent(topic, "duplicate", 1, 0)

    def acked_by_epoch(self) -> dict[int, int]:
        """Sends this broker answered OK itself, by the master epoch it held then."""
        return self._parts.roles.acked_by_epoch()

    def demote(self, master: str | None) -> None:
        """Stop being master and follow the master at replication address ``master`` (None: later)."""
        self._parts.switch.demote(master)

    def follow(self, master: str) -> None:
        """As a slave, copy the log of the master at replication address ``master``."""
        self._parts.switch.follow(master)

    def check_writable(self, action: str = "take writes") -> None:
        """ReadOnlyBrokerError on a slave: only its master takes writes."""
        self._parts.roles.check_writable(action)

    def await_replication(self, end_offset: int | None = None) -> SendStatus:
        """On a ``sync_master``: wait until a slave holds the log up to ``end_offset`` (default: its
        end now); SEND_OK at once on any other broker."""
        return self._parts.roles.await_replication(end_offset)

    @property
    def sends_wait(self) -> bool:
        """Whether a normal send may block on I/O: the store flushes synchronously (or cannot say),
        or a replication service may make the answer wait for a slave. ``plugmq serve`` stores on
        its event loop when this is False and hands the sends to a thread when it is True."""
        return self.replication is not None or self._store_waits

    @property
    def pop_waits(self) -> bool:
        """Whether a pop ack or receive may block on I/O: its journal record waits for a slave or a
        flush (``pop_fsync``), or its store's appends do."""
        return self.sends_wait or self.config.pop_fsync

    @functools.cached_property
    def _store_waits(self) -> bool:
        store = self.store  # its flush mode is fixed when it opens; isinstance on a Protocol is slow
        return not isinstance(store, FlushMode) or store.appends_wait_for_disk

    # ------------------------------------------------------------------------------ reads
    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        """Compile a subscription with this broker's filter plugins."""
        return self._parts.reads.compile_subscription(expression_type, expression)

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32,
             subscription: Filter | None = None, *, consumer_group: str = "", client_id: str = "") -> PullResult:
        """Read up to ``max_nums`` matching messages from ``offset`` of ``queue`` (RateLimitedError when
        ``consumer_group`` is over its rate limit)."""
        return self._parts.reads.pull(queue, offset, max_nums, subscription, consumer_group=consumer_group,
                                      client_id=client_id)

    # ------------------------------------------------------------------------------ request-reply
    @property
    def reply_cluster(self) -> str:
        """Whose reply topic requests sent here name: the cluster's (the broker's outside a cluster);
        replies go to ``<it>_REPLY_TOPIC``."""
        return self.config.cluster_name or self.name

    def expect_reply(self, correlation_id: str) -> PendingReply:
        """Wait for the reply with ``correlation_id`` (``Producer.request``): set when it is stored."""
        return self._parts.replies.expect(correlation_id)

    def forget_reply(self, correlation_id: str) -> None:
        self._parts.replies.forget(correlation_id)

    @property
    def rate_limits(self) -> RateLimiter:
        """The rate limits in force (``[limits]``, changed at run time with ``set``)."""
        return self._parts.limits

    @property
    def dedup(self) -> DedupWindows:
        """The dedup windows of the topics that have one (``[topics.<t>] dedup``)."""
        return self._parts.dedup

    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message stored at ``commit_log_offset`` (None if retention removed it)."""
        return self._parts.reads.read_message(commit_log_offset, size)

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        return self._parts.reads.query_by_id(msg_id)

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        return self._parts.reads.query_by_key(topic, key, max_results=max_results, begin_ms=begin_ms, end_ms=end_ms)

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None) -> int:
        """Where a group with no position on ``queue`` starts (first, last, or from a timestamp)."""
        return self._parts.reads.start_offset(queue, consume_from, timestamp_ms)

    def offset_for_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return self._parts.reads.offset_for_timestamp(queue, timestamp_ms)

    def min_offset(self, queue: MessageQueue) -> int:
        return self._parts.reads.min_offset(queue)

    def max_offset(self, queue: MessageQueue) -> int:
        return self._parts.reads.max_offset(queue)

    # ------------------------------------------------------------------------------ clients
    def producer(self, group: str, **options: Any) -> Producer:
        """A producer for ``group`` (sync, async, one-way and batch sends)."""
        self._parts.lifecycle.check_open()
        return Producer(self, group, **options)

    def push_consumer(self, group: str, listener: Callable[[list[StoredMessage]], Any], **options: Any) -> PushConsumer:
        """A push consumer of ``group``; call ``subscribe(...)`` then ``start()``."""
        self._parts.lifecycle.check_open()
        return PushConsumer(self, group, listener, **options)

    def pull_consumer(self, group: str) -> PullConsumer:
        """A pull consumer of ``group``: the caller picks queues and offsets and commits them."""
        self._parts.lifecycle.check_open()
        return PullConsumer(self, group)

    def simple_consumer(self, group: str, subscriptions: Mapping[str, str | FilterExpression] | None = None, *,
                        consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET, consume_timestamp_ms: int | None = None,
                        await_duration_s: float = 0.0, client_id: str | None = None) -> SimpleConsumer:
        """A simple (pop) consumer of ``group``: ``receive``, ``ack``, ``change_invisible_duration``.

        ``subscriptions`` maps topics to filter expressions: a TAG expression string, or a
        :class:`FilterExpression` (SQL92 with ``FilterExpression(text, "SQL92")``).
        """
        self._parts.lifecycle.check_open()
        return SimpleConsumer(self, self.pop, group, subscriptions, consume_from=consume_from,
                              consume_timestamp_ms=consume_timestamp_ms, await_duration_s=await_duration_s,
                              client_id=client_id)

    def transaction_producer(self, group: str, local_transaction: LocalTransaction,
                             check_listener: TransactionChecker) -> TransactionProducer:
        """A transactional producer of ``group`` (needs a transaction plugin, e.g. ``txn``).

        ``send_in_transaction(message, arg)`` stores a half message, runs
        ``local_transaction(message, arg)`` and commits or rolls back; UNKNOWN (or an exception) is
        settled later by the plugin asking ``check_listener(message)`` of a live producer.
        """
        self._parts.lifecycle.check_open()
        self.check_writable("send transactional messages")
        return TransactionProducer(self, group, local_transaction, check_listener)

    def register_consumer(self, consumer: Stoppable) -> None:
        """Shut ``consumer`` down when the broker closes."""
        self._parts.lifecycle.register_consumer(consumer)

    def unregister_consumer(self, consumer: Stoppable) -> None:
        self._parts.lifecycle.unregister_consumer(consumer)

    def wake_consumers(self) -> None:
        """Tell waiting consumers that messages arrived or became visible again (long polling),
        and every arrival listener."""
        self._parts.arrivals.wake()

    def wait_for_messages(self, timeout: float) -> None:
        """Block until messages arrive or ``timeout`` real seconds passed."""
        self._parts.arrivals.wait(timeout)

    # ------------------------------------------------------------------------------ consumer groups
    def group_policy(self, group: str) -> GroupPolicy:
        """The group's policy from ``[groups]`` (redelivery, FIFO), or the configured defaults."""
        return self._parts.redelivery.group_policy(group)

    def offsets(self, group: str, member: str | None = None) -> OffsetStore:
        """The broker-kept offsets of a clustering group (one atomically rewritten file), or with
        ``member``, those of one member of a broadcasting group (each member keeps its own)."""
        return self.consumer_offsets.view(group, member)

    def delete_group(self, group: str) -> int:
        """Forget everything the broker keeps for ``group``: its offsets and its pop consumers'
        progress and in-flight messages (returns how many pop queues it had). Refused while push
        consumers of the group are running."""
        self._parts.lifecycle.check_open()
        validate_group(group)
        members = self.groups.members(group)
        if members:
            raise ClientError(f"group {group!r} still has running consumers ({', '.join(members)}); "
                              "shut them down before deleting the group")
        self.consumer_offsets.forget_group(group)
        dropped = self.pop.delete_group(group)
        log.info("consumer group deleted", group=group, pop_lanes=dropped)
        return dropped

    def allocation_strategy(self, name: str, params: Mapping[str, Any] | None = None, *,
                            group: str | None = None) -> AllocateStrategy:
        """A new instance of the allocation strategy ``name`` (from the broker's allocation plugins).

        A room strategy (MACHINE_ROOM, MACHINE_ROOM_NEARBY) of ``group`` gets the rooms of the
        brokers as configured (``[broker] room``, every broker of the cluster) and of the group's
        consumers as each was configured (``PushConsumer(room=...)``), unless ``params`` give
        resolvers of their own."""
        factory = self.strategies.get(name)
        if factory is None:
            raise ClientError(f"allocation strategy {name!r} is not offered by broker {self.name!r}; "
                              f"available: {', '.join(sorted(self.strategies)) or 'none (add the alloc plugin)'}")
        given = dict(params or {})
        strategy = factory(**given)
        if not strategy.capabilities.room_aware or {"broker_room", "consumer_room", "resolver"} & set(given):
            return strategy
        rooms = self._broker_rooms()
        members = self.groups
        return factory(**given, broker_room=lambda broker: rooms().get(broker) or None,
                       consumer_room=lambda client_id: members.room_of(group or "", client_id))

    def _broker_rooms(self) -> Callable[[], dict[str, str]]:
        """Broker name -> configured room: this broker's, and (in a cluster) every live broker's."""
        def rooms() -> dict[str, str]:
            found = {self.name: self.config.room} if self.config.room else {}
            if self.cluster is not None:
                for broker in sorted(self.cluster.view().brokers, key=lambda b: -b.broker_id):  # a master's wins
                    if broker.room:
                        found[broker.broker_name] = broker.room
            return found

        return rooms

    def join_group(self, member: GroupMember) -> None:
        """Add a clustering consumer to its group (rebalances the group)."""
        self.groups.register(member)

    def leave_group(self, member: GroupMember) -> None:
        self.groups.unregister(member)

    def heartbeat(self, group: str, client_id: str) -> bool:
        return self.groups.heartbeat(group, client_id)

    # ------------------------------------------------------------------------------ events
    def report_delivered(self, group: str, messages: list[StoredMessage], client_id: str = "") -> None:
        """Pop consumption handed ``messages`` to ``group`` again (redeliveries)."""
        self._parts.events.delivered(group, messages, client_id)

    def report_acked(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        """A consumer of ``group`` consumed ``messages`` successfully (a push listener's success)."""
        self._parts.events.acked(group, messages, client_id)

    def report_redriven(self, group: str, message: StoredMessage, copy_msg_id: str, topic: str) -> None:
        """An operator sent ``group``'s dead letter ``message`` back; its copy ``copy_msg_id`` is on ``topic``."""
        self._parts.events.redriven(group, message, copy_msg_id, topic)

    def report_retried(self, group: str, message: StoredMessage, reconsume_times: int) -> None:
        """A consumer of ``group`` gave up on ``message`` for now; it comes back later."""
        self._parts.events.retried(group, message, reconsume_times)

