"""The broker: assembled from a plugin list, routing every call through the chosen families.

Data flows one way: the broker builds its clients (producers, push / pull / simple consumers, the
transaction producer) and hands itself to them as the port each needs (plugmq.client.ports); no
client module imports this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.groups import GroupMember, GroupRegistry
from plugmq.broker.journal import JournalSet
from plugmq.broker.offsets import ConsumerOffsets, OffsetStore
from plugmq.broker.pop import PopService, ReceivedMessage
from plugmq.broker.popstate import PopState, adopt_legacy_state
from plugmq.broker.replication import TopicFollower, open_replication, read_only_error
from plugmq.broker.retention import RetentionSchedule, consumer_group_floor, pop_consumer_floor
from plugmq.broker.topics import TopicTable
from plugmq.broker.traffic import Traffic
from plugmq.client.consumer import PullConsumer, PushConsumer
from plugmq.client.ports import Stoppable
from plugmq.client.producer import Producer
from plugmq.client.simple import FilterExpression, SimpleConsumer
from plugmq.client.transactions import LocalTransaction, TransactionProducer
from plugmq.config.broker import DEFAULT_PLUGINS, BrokerConfig, load_config
from plugmq.config.datadir import prepare_data_dir
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts import (
    AllocateStrategy,
    AllocateStrategyFactory,
    BrokerRole,
    ClusterContext,
    ClusterService,
    ConsumerHandover,
    DelayContext,
    DelayScheduler,
    FailoverReplication,
    Family,
    Filter,
    FilterCompiler,
    MessageStore,
    PluginContext,
    ReplicationService,
    TransactionChecker,
    TransactionContext,
    TransactionService,
)
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.errors import (
    ClientError,
    DelayUnsupportedError,
    FilterSyntaxError,
    MessageTooLargeError,
    PluginError,
    ReplicationError,
    TopicError,
    ValidationError,
)
from plugmq.core.hashing import tags_code
from plugmq.core.logs import get_logger
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
    StoredMessage,
    check_body_size,
    new_unique_id,
)
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import Prop, is_system_topic, retry_topic, validate_group, validate_topic
from plugmq.core.pluginmanager import LoadedPlugins, build_options, installed_of_family, load_plugins
from plugmq.core.retention import RetentionFloor

__all__ = ["Broker"]

log = get_logger(__name__)

_PULL_SCAN_FACTOR = 16  # entries scanned per wanted message before a filtered pull gives up


class Broker:
    """One broker: a store, optional delay and transaction services, filters and strategies.

    Build it with :meth:`open` or :meth:`from_config`; use it as a context manager or call
    :meth:`close`, which stops background services and flushes the store.
    """

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None,
                 plugin_objects: Mapping[str, object] | None = None) -> None:
        self.config = config
        self.name = config.name
        self.clock: Clock = clock or SystemClock()
        self.data_dir = Path(config.data_dir)
        self._closed = False
        self._lock = threading.Lock()
        self._arrivals = threading.Condition()
        self._waiting = 0
        # Called (in the storing thread) whenever consumers are woken: messages stored, or visible
        # again. Cheaper than a message_stored hook for who only needs to know that (plugmq serve).
        self.arrival_listeners: list[Callable[[], None]] = []
        self._consumers: list[Stoppable] = []
        self._queue_cache: dict[str, tuple[MessageQueue, ...]] = {}
        self.traffic = Traffic()  # messages in/out and append latency, for metrics
        # With failover the election picks the master: every broker starts as a slave, and
        # ``role`` names the mode it works in whenever it is master.
        self.master_role = BrokerRole(config.role)
        self.role = BrokerRole.SLAVE if config.failover else self.master_role
        self._role_lock = threading.RLock()
        self.replication: ReplicationService | None = None
        self.plugins: LoadedPlugins = load_plugins(
            config.plugins, config_path=f"{config.source}: broker.plugins", objects=plugin_objects
        )
        options = {
            name: build_options(decl, config.plugin_options.get(name), config_path=f"{config.source}: plugins.{name}")
            for name, decl in self.plugins.declarations.items()
        }
        prepare_data_dir(self.data_dir, config.source)
        self.retention_floor = RetentionFloor()
        self.retention = RetentionSchedule(self.clock)
        base: dict[str, Any] = {"broker_name": self.name, "data_dir": self.data_dir, "clock": self.clock,
                                "store_host": config.store_host, "max_message_size": config.max_message_size,
                                "options": options, "retention": self.retention_floor}
        hooks = self.plugins.hooks
        context = PluginContext(**base)
        hooks.configure(context)
        store = hooks.make_store(context)
        if store is None:
            raise PluginError(f"storage plugin {self.plugins.with_family(Family.STORAGE)} returned no store")
        self.store: MessageStore = store
        try:
            self.filters: dict[str, FilterCompiler] = hooks.filter_compilers()
            self.strategies: dict[str, AllocateStrategyFactory] = hooks.allocate_strategies()
            self.topics = TopicTable(self.broker_dir / "topics.json", self.store.queues())
            self.groups = GroupRegistry(self.clock, config.heartbeat_timeout_s, self.topic_queues)
            # Service state rides in the commit log (plugmq.broker.journal): one order, one cut.
            self.journals = JournalSet(self.store, writable=lambda: self.role is not BrokerRole.SLAVE,
                                       settle=self.await_replication, broker_name=self.name,
                                       floor=self.retention_floor, clock=self.clock)
            self.consumer_offsets = ConsumerOffsets(
                self.journals.open("offsets", compact=lambda: self.consumer_offsets.compact()),
                legacy_root=self.broker_dir)
            self._delay_context: DelayContext | None = None
            self.delay_ledger: DelayLedger | None = None  # with replication: see below
            if self.plugins.with_family(Family.DELAY):
                self._delay_context = DelayContext(**base, store=self.store, deliver=self._deliver_delayed,
                                                   was_delivered=self._was_delivered,
                                                   deliver_batch=self._deliver_batch)
            self._txn_context: TransactionContext | None = None
            if self.plugins.with_family(Family.TRANSACTION):
                self._txn_context = TransactionContext(**base, store=self.store, deliver=self._deliver,
                                                       journal=self.journals.open("txn"))
            self.delay: DelayScheduler | None = None
            self.transactions: TransactionService | None = None
            self._build_services()
            self._topic_follower = TopicFollower(self.store, self.topics.ensure, self.topics.get)
            self.replication = open_replication(self.plugins, base, self.store, role=self.role,
                                                broker_id=config.broker_id, replicated=self._on_replicated,
                                                truncated=self._on_truncated, failover=config.failover,
                                                where=config.source, handover=self._consumer_handover,
                                                handed_over=self._consumer_handed_over,
                                                adopt=self._adopt_consumer_progress)
            # With replication, delayed messages are intents in the log too, so a promoted slave
            # delivers what its master had pending (plugmq.broker.delayledger).
            if self.replication is not None and self._delay_context is not None:
                self.delay_ledger = DelayLedger(
                    self.journals.open("delay", compact=lambda: self._compact_delay_ledger()), self._was_delivered)
                self.retention_floor.hold("delay intents", self.delay_ledger.floor)
                if self.role is not BrokerRole.SLAVE:
                    self.delay_ledger.load()
            adopt_legacy_state(self.broker_dir / "pop", self.data_dir / "server")
            self.pop = PopService(self, PopState(
                self.journals.open("pop", compact=lambda: self.pop.state.compact()), fsync=config.pop_fsync,
                compact_bytes=config.pop_compact_bytes, legacy_dir=self.broker_dir / "pop"))
            self.pop.collect(self.topics.all())
            self.pop.deadline_listeners.append(self.wake_consumers)
            # A slave's store is written by the replication stream alone: no delay or transaction
            # service of its own may deliver into it; they start when it is promoted.
            self._start_retention()
            if self.role is not BrokerRole.SLAVE:
                self._start_services()
            self.pop.start()
            if self.replication is not None:
                self.replication.start()
            self.cluster: ClusterService | None = self._join_name_service(base)
        except BaseException:
            self._close_services()
            raise
        log.info("broker started", broker=self.name, plugins=list(config.plugins), data_dir=str(self.data_dir))
        hooks.broker_started(self.name, self)

    def _join_name_service(self, base: dict[str, Any]) -> ClusterService | None:
        """The cluster plugin's session when the config names a cluster; None for a single broker."""
        plugins = self.plugins.with_family(Family.CLUSTER)
        cluster_name = self.config.cluster_name
        if not plugins and cluster_name is None:
            return None
        where = self.config.source
        if not plugins:
            installed = installed_of_family(Family.CLUSTER)
            raise PluginError(f"{where}: [cluster] name = {cluster_name!r} needs a cluster plugin in broker.plugins; "
                              f"add one of: {', '.join(installed) or 'cluster_zk'}")
        if cluster_name is None:
            raise PluginError(f"{where}: plugin {plugins[0]!r} joins a cluster but the config names none; add "
                              f'[cluster] with name = "<cluster>", or remove {plugins[0]!r} for a single broker')
        service = self.plugins.hooks.make_cluster_service(ClusterContext(**base, cluster_name=cluster_name))
        if service is None:
            raise PluginError(f"cluster plugin {plugins[0]!r} returned no cluster service")
        return service

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
        **broker_settings: Any,
    ) -> Broker:
        """Assemble a broker in ``data_dir`` from plugin names (default set when None).

        ``options`` are the plugins' tables (``[plugins.<name>]``), ``groups`` the ``[groups]``
        table (defaults as keys, one table or :class:`GroupPolicy` per group), ``broker_settings``
        the rest of ``[broker]``.
        """
        mapping: dict[str, Any] = {
            "broker": {"name": name, "data_dir": str(data_dir),
                       "plugins": list(plugins if plugins is not None else DEFAULT_PLUGINS), **broker_settings},
            "plugins": dict(options or {}),
            "groups": dict(groups or {}),
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

    # ------------------------------------------------------------------------------ topics
    def create_topic(self, topic: str, queue_count: int | None = None) -> list[MessageQueue]:
        """Create (or grow) a topic; returns its queues."""
        count = self.topics.ensure(topic, queue_count or self.config.default_queue_count)
        return list(self._queues_for(topic, count))

    def _queues_for(self, topic: str, count: int) -> tuple[MessageQueue, ...]:
        cached = self._queue_cache.get(topic)
        if cached is None or len(cached) != count:
            cached = tuple(MessageQueue(topic, self.name, i) for i in range(count))
            self._queue_cache[topic] = cached
        return cached

    def topic_queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]:
        """The queues of ``topic``; auto-creates it when allowed, else TopicError naming it."""
        count = self.topics.get(topic)
        if count is None:
            validate_topic(topic)
            if create if create is not None else self.config.auto_create_topic:
                return self.create_topic(topic)
            raise TopicError(
                f"topic {topic!r} does not exist and auto_create_topic is off; "
                f"create it with broker.create_topic({topic!r}, queue_count)"
            )
        return list(self._queues_for(topic, count))

    # ------------------------------------------------------------------------------ sending
    def build_request(self, message: Message, queue_id: int, *, reconsume_times: int = 0,
                      extra_properties: Mapping[str, str] | None = None, sys_flag: int = 0,
                      born_host: str = "127.0.0.1:0") -> AppendRequest:
        """Turn a producer's Message into the store's request (system properties filled in).

        The Message was validated when it was built, so the request is assembled without running
        the validators again (the store checks what it writes); tag codes come from a cache."""
        check_body_size(message.body, self.config.max_message_size, topic=message.topic)
        if queue_id < 0:
            raise ValidationError(f"queue id must be >= 0, got {queue_id}")
        props = dict(message.properties)
        tags = message.tags
        if tags is not None:
            props[Prop.TAGS] = tags
        if message.keys:
            props[Prop.KEYS] = " ".join(message.keys)
        if Prop.UNIQ_KEY not in props:
            props[Prop.UNIQ_KEY] = new_unique_id()
        if extra_properties:
            props.update(extra_properties)
        return AppendRequest.trusted(
            message.topic, queue_id, message.body, props, tags_code=tags_code(tags),
            born_timestamp_ms=self.clock.now_ms(), born_host=born_host, reconsume_times=reconsume_times,
            sys_flag=sys_flag,
        )

    def put(self, message: Message, queue_id: int, *, allow_system_topic: bool = False,
            reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
            await_slave: bool = True) -> SendResult:
        """Store one message on ``queue_id`` of its topic (delayed ones go to the delay plugin).

        On a ``sync_master`` the answer waits for a slave, unless ``await_slave`` is False: then the
        caller waits itself, once for many sends (``await_replication``), as ``plugmq serve`` does.
        """
        self._check_open()
        self.check_writable("store messages")
        topic = message.topic
        if is_system_topic(topic) and not allow_system_topic:
            raise TopicError(f"topic {topic!r} is a system topic; producers may not send to it")
        count = self.topics.get(topic)
        queues = self._queues_for(topic, count) if count is not None else self.topic_queues(topic)
        if not 0 <= queue_id < len(queues):
            raise ValidationError(f"queue id {queue_id} is out of range for topic {message.topic!r} "
                                  f"({len(queues)} queues)")
        request = self.build_request(message, queue_id, reconsume_times=reconsume_times,
                                     extra_properties=extra_properties)
        if message.is_delayed:
            result = self._schedule(message, request)
            self.traffic.sent(message.topic, "delay", 1, len(message.body))
            replica = self.await_replication() if await_slave else SendStatus.SEND_OK
        else:
            started = time.perf_counter()
            result = self.store.append(request)
            kind = "fifo" if Prop.SHARDING_KEY in request.properties else "normal"
            self.traffic.sent(message.topic, kind, 1, len(message.body), time.perf_counter() - started)
            replica = (self.await_replication(result.commit_log_offset + result.size) if await_slave
                       else SendStatus.SEND_OK)
            self._emit_stored(result, request)
            self.wake_consumers()
        return self._send_result(result, request, queues[queue_id], replica)

    def put_batch(self, messages: Sequence[Message], queue_id: int, *,
                  extra_properties: Sequence[Mapping[str, str] | None] | None = None,
                  await_slave: bool = True) -> list[SendResult]:
        """Store several messages of one topic on one queue in one store batch.

        ``extra_properties``: per message, system properties to add (as ``put``'s argument);
        ``await_slave``: as for ``put``.
        """
        self._check_open()
        self.check_writable("store messages")
        if not messages:
            raise ValidationError("a batch needs at least one message")
        if extra_properties is not None and len(extra_properties) != len(messages):
            raise ValidationError(f"extra_properties has {len(extra_properties)} entries for {len(messages)} messages")
        topic = messages[0].topic
        total = 0
        for i, message in enumerate(messages):
            if message.topic != topic:
                raise ValidationError(f"batch message {i} has topic {message.topic!r}; "
                                      f"every message of a batch must have topic {topic!r}")
            if message.is_delayed:
                raise ValidationError(f"batch message {i} is delayed; delayed messages cannot be batched")
            total += len(message.body)
        if total > self.config.max_message_size:
            raise MessageTooLargeError(f"batch bodies total {total} bytes; the limit is {self.config.max_message_size} "
                                       "(send the batch in smaller parts)")
        if is_system_topic(topic):
            raise TopicError(f"topic {topic!r} is a system topic; producers may not send to it")
        queues = self.topic_queues(topic)
        if not 0 <= queue_id < len(queues):
            raise ValidationError(f"queue id {queue_id} is out of range for topic {topic!r}")
        extras = extra_properties or [None] * len(messages)
        requests = [self.build_request(m, queue_id, extra_properties=x) for m, x in zip(messages, extras, strict=True)]
        started = time.perf_counter()
        results = self.store.append_batch(requests)
        self.traffic.sent(topic, "normal", len(messages), total, time.perf_counter() - started)
        replica = (self.await_replication(results[-1].commit_log_offset + results[-1].size) if await_slave
                   else SendStatus.SEND_OK)
        for result, request in zip(results, requests, strict=True):
            self._emit_stored(result, request)
        self.wake_consumers()
        return [self._send_result(r, q, queues[queue_id], replica) for r, q in zip(results, requests, strict=True)]

    def _send_result(self, result: AppendResult, request: AppendRequest, queue: MessageQueue,
                     replica: SendStatus = SendStatus.SEND_OK) -> SendResult:
        status = SendStatus.SEND_OK if result.status is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT
        if replica is not SendStatus.SEND_OK:  # as RocketMQ's handleHA: the slave's verdict comes last
            status = replica
        return SendResult(status=status, msg_id=result.msg_id, unique_id=request.properties[Prop.UNIQ_KEY],
                          queue=queue, queue_offset=result.queue_offset)

    def _schedule(self, message: Message, request: AppendRequest) -> AppendResult:
        if self.delay is None:
            serving = installed_of_family(Family.DELAY)
            raise DelayUnsupportedError(
                f"message to {message.topic!r} asks for a delay but broker {self.name!r} has no delay plugin; "
                f"add one of {', '.join(serving) or 'delay_level, delay_wheel, delay_schedule'} to broker.plugins"
            )
        levels = self.delay.capabilities.levels_ms or DEFAULT_DELAY_LEVELS_MS
        level = message.delay_level
        if level is not None:
            deliver_at = self.clock.now_ms() + levels[min(level, len(levels)) - 1]
        else:
            assert message.deliver_at_ms is not None
            deliver_at = message.deliver_at_ms
        extra = {Prop.DELAY_LEVEL: str(level)} if level is not None else {Prop.DELIVER_AT_MS: str(deliver_at)}
        request = attrs.evolve(request, properties={**request.properties, **extra})
        delay = self.delay
        if self.delay_ledger is not None:
            return self.delay_ledger.accept(
                request, deliver_at, level, lambda: delay.schedule(request, deliver_at_ms=deliver_at, delay_level=level))
        return delay.schedule(request, deliver_at_ms=deliver_at, delay_level=level)

    def _compact_delay_ledger(self) -> None:
        if self.delay_ledger is not None:
            self.delay_ledger.compact()

    def _deliver(self, request: AppendRequest) -> AppendResult:
        """Write-back used by the delay and transaction services: a normal message on its topic."""
        self.check_writable("deliver delayed or transactional messages")
        self.topics.ensure(request.topic, request.queue_id + 1)
        result = self._append(request)
        self._emit_stored(result, request)
        self.wake_consumers()
        return result

    def _append(self, request: AppendRequest) -> AppendResult:
        started = time.perf_counter()
        result = self.store.append(request)
        self.traffic.appended(time.perf_counter() - started)
        return result
    # ------------------------------------------------------------------------------ roles
    def _build_services(self) -> None:
        """The delay and transaction services, built (not started: a master starts them)."""
        hooks = self.plugins.hooks
        if self._delay_context is not None:
            self.delay = hooks.make_delay_scheduler(self._delay_context)
        if self._txn_context is not None:
            self.transactions = hooks.make_transaction_service(self._txn_context)

    @property
    def epoch(self) -> int:
        """The newest master epoch this broker's log knows (0 without failover)."""
        replication = self.replication
        return replication.epoch if isinstance(replication, FailoverReplication) else 0

    def _failover_replication(self, action: str) -> FailoverReplication:
        replication = self.replication
        if not isinstance(replication, FailoverReplication):
            raise ReplicationError(f"broker {self.name!r} cannot {action}: its replication plugin does not switch "
                                   "roles (capabilities.failover); use the ha plugin")
        return replication

    def promote(self, epoch: int) -> None:
        """Become the master of this broker name for ``epoch`` (the election was won): take the
        rest of the followed state, write it as the services' first snapshots (the changes this
        broker's own readers made as a slave become durable), start the delay and transaction
        services (they replay their journals: what the old master decided stays decided, what
        it had open is checked back), and take writes as ``master_role``."""
        with self._role_lock:
            self._check_open()
            replication = self._failover_replication("become master")
            replication.promote(epoch, self.master_role)
            self._topic_follower.refresh()
            self.consumer_offsets.follow()
            self.pop.state.follow()
            self.role = self.master_role
            self.consumer_offsets.compact()
            self.pop.state.compact()
            # Pending intents first: the delay plugin may hold stale copies from an earlier
            # mastership and deliver them as it starts; the write-back checks them against these.
            ledger = self.delay_ledger
            taken_over = ledger.load() if ledger is not None else []
            self._start_services()
            if ledger is not None and self.delay is not None and taken_over:
                ledger.schedule_taken_over(self.delay, taken_over)
            self.pop.start()  # dead-letter what ran out of attempts while no master could
        log.warning("broker promoted to master", broker=self.name, epoch=epoch, mode=self.master_role.value)

    def _start_services(self) -> None:
        if self.delay is not None:
            self.delay.start()
        if self.transactions is not None:
            self.transactions.start()
        self.retention.add("delay", self.delay)
        self.retention.add("transactions", self.transactions)

    def demote(self, master: str | None) -> None:
        """Stop being master (the election was lost, or another broker holds a newer epoch): take
        no more writes, stop the delay and transaction services (rebuilt, not started, for a later
        promotion), and follow the master at replication address ``master`` (None: follow later,
        with :meth:`follow`). Sends of a ``sync_master`` still waiting for a slave are answered."""
        with self._role_lock:
            was_master = self.role.is_master
            self.role = BrokerRole.SLAVE
            if was_master:
                for service in (self.transactions, self.delay):
                    if service is not None:
                        service.close()
                self._build_services()
                self.retention.add("delay", self.delay)
                self.retention.add("transactions", self.transactions)
            if master is not None:
                self._failover_replication("follow a master").follow(master)
        if was_master:
            log.warning("broker demoted to slave", broker=self.name, epoch=self.epoch, master=master)

    def follow(self, master: str) -> None:
        """As a slave, copy the log of the master at replication address ``master``."""
        with self._role_lock:
            if self.role.is_master:
                self.demote(master)
                return
            self._failover_replication("follow a master").follow(master)

    # ------------------------------------------------------------------------------ replication
    def check_writable(self, action: str = "take writes") -> None:
        """ReadOnlyBrokerError on a slave: only its master takes writes."""
        if self.role is BrokerRole.SLAVE:
            raise read_only_error(self.name, action)

    def await_replication(self, end_offset: int | None = None) -> SendStatus:
        """On a ``sync_master``: wait until a slave holds the log up to ``end_offset`` (default: its
        end now) and say how it went (SEND_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE);
        SEND_OK at once on any other broker."""
        if self.replication is None:
            return SendStatus.SEND_OK
        if self.role is not BrokerRole.SYNC_MASTER:
            # A send stored just before a failover demotion: no slave will confirm it here.
            lost_race = self.config.failover and self.master_role is BrokerRole.SYNC_MASTER
            return SendStatus.SLAVE_NOT_AVAILABLE if lost_race and self.role is BrokerRole.SLAVE else SendStatus.SEND_OK
        if end_offset is None:
            end_offset = getattr(self.store, "log_end_offset", lambda: 0)()
        return self.replication.await_replicated(end_offset)

    def _on_truncated(self, end_offset: int) -> None:
        """A slave cut its log back to where it agrees with a new master: the state it followed
        from the cut records is gone with them; rebuild it from the log."""
        self.consumer_offsets.reload()
        pop: PopService | None = getattr(self, "pop", None)
        if pop is not None:
            pop.state.reload()
        log.warning("followed state rebuilt after the log was cut", broker=self.name, log_end=end_offset)

    def _on_replicated(self, _end_offset: int) -> None:
        """A slave appended replicated records: learn their topics, follow the master's state
        (offsets, pop progress), wake long polls."""
        self._topic_follower.refresh()
        self.consumer_offsets.follow()
        pop: PopService | None = getattr(self, "pop", None)
        if pop is not None:
            pop.state.follow()
        self.wake_consumers()

    def _consumer_handover(self) -> ConsumerHandover:
        """A slave connecting to a master: the pop progress its own readers made (served while no
        master was up), for the master to adopt."""
        pop: PopService | None = getattr(self, "pop", None)
        return pop.state.handover() if pop is not None else []

    def _consumer_handed_over(self, lanes: ConsumerHandover) -> None:
        pop: PopService | None = getattr(self, "pop", None)
        if pop is not None:
            pop.state.handed_over(lanes)

    def _adopt_consumer_progress(self, lanes: ConsumerHandover, shared_end: int) -> int:
        """A master: a connecting slave's readers' progress moves this broker's pop lanes forward
        (within the log both share, up to ``shared_end``)."""
        pop: PopService | None = getattr(self, "pop", None)
        if pop is None or self.role is BrokerRole.SLAVE:
            # Between listening as master and taking writes (a promotion): the slave offers it again.
            raise read_only_error(self.name, "take a slave's consumer progress before it takes writes")
        moved = pop.adopt(lanes, shared_end)
        if moved:
            self.wake_consumers()
        return moved

    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message stored at ``commit_log_offset`` (None if retention removed it)."""
        return self.store.read(commit_log_offset, size)

    def _deliver_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Batched write-back of the delay service: one store batch (per run, see below),
        consumers woken once. As in ``_deliver_delayed``, with replication a message whose intent
        is no longer pending and which is on its topic already - stored before, or earlier in this
        very batch (a copy the plugin kept from an earlier mastership beside the one the ledger
        handed it) - is answered with that copy instead of being written again."""
        if not requests:
            return []
        self.check_writable("deliver delayed messages")
        ledger = self.delay_ledger
        if ledger is None:
            return self._append_delivered(requests)
        results: list[AppendResult | None] = [None] * len(requests)
        run: list[int] = []  # requests to write, in order
        written: dict[tuple[str, int], int] = {}  # (unique id, attempt) -> its request in this batch
        copies: dict[int, int] = {}  # request -> the request of this batch it repeats

        def flush() -> None:
            for i, result in zip(run, self._append_delivered([requests[i] for i in run]), strict=True):
                results[i] = result
            run.clear()

        for i, request in enumerate(requests):
            unique = request.properties.get(Prop.UNIQ_KEY)
            key = (unique or "", request.reconsume_times)
            if not ledger.take_pending(request):
                if unique and key in written:
                    copies[i] = written[key]
                    continue
                flush()  # what this batch wrote so far is on its topic before the check
                copy = self._delivered_copy(request)
                if copy is not None:
                    log.info("delayed message delivered already (by an earlier master); not written again",
                             broker=self.name, topic=request.topic, unique_id=copy.unique_id)
                    results[i] = AppendResult(AppendStatus.PUT_OK, copy.msg_id, copy.queue_offset,
                                              copy.commit_log_offset, copy.size, copy.store_timestamp_ms)
                    continue
            if unique:
                written[key] = i
            run.append(i)
        flush()
        for i, original in copies.items():
            results[i] = results[original]
        return [result for result in results if result is not None]

    def _append_delivered(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """``requests`` appended with one ``append_batch``: topics ensured, stored events, wake-up."""
        if not requests:
            return []
        needed: dict[str, int] = {}
        for request in requests:
            needed[request.topic] = max(needed.get(request.topic, 0), request.queue_id + 1)
        for topic, count in needed.items():
            self.topics.ensure(topic, count)
        results = self._append_batch(requests)
        if self.plugins.hooks.observers.message_stored:
            for result, request in zip(results, requests, strict=True):
                self._emit_stored(result, request)
        self.wake_consumers()
        return results

    def _was_delivered(self, request: AppendRequest) -> bool:
        return self._delivered_copy(request) is not None

    def _delivered_copy(self, request: AppendRequest) -> StoredMessage | None:
        """The message of ``request`` on its real topic (same unique id and attempt), if stored."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        if not unique:
            return None
        return next((m for m in self.store.query_by_key(request.topic, unique, max_results=64)
                     if m.unique_id == unique and m.reconsume_times == request.reconsume_times), None)

    def _deliver_delayed(self, request: AppendRequest) -> AppendResult:
        """The delay service's write-back: with replication, a message whose intent is no longer
        pending and which is on its topic already is not written twice (plugmq.broker.delayledger)."""
        ledger = self.delay_ledger
        if ledger is not None and not ledger.take_pending(request):
            copy = self._delivered_copy(request)
            if copy is not None:
                log.info("delayed message delivered already (by an earlier master); not written again",
                         broker=self.name, topic=request.topic, unique_id=copy.unique_id)
                return AppendResult(AppendStatus.PUT_OK, copy.msg_id, copy.queue_offset, copy.commit_log_offset,
                                    copy.size, copy.store_timestamp_ms)
        return self._deliver(request)

    # ------------------------------------------------------------------------------ events
    # Each event hook is emitted in one place, here: the stored, delivered, retried and
    # dead-lettered events of every way of sending and consuming.
    def _emit_stored(self, result: AppendResult, request: AppendRequest) -> None:
        if self.plugins.hooks.observers.message_stored:
            try:  # built from what was sent and where it landed, not read back from the store
                stored: StoredMessage | None = StoredMessage.from_append(request, result)
            except ValidationError:  # a store whose ids are not offset message ids
                stored = self.store.read(result.commit_log_offset, result.size)
            if stored is not None:
                self.plugins.hooks.message_stored(self.name, stored)

    def _emit_delivered(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        if group and messages:
            self.traffic.delivered(group, messages)
        if group and messages and self.plugins.hooks.observers.message_delivered:
            for message in messages:  # a pop redelivery knows its attempt; a pulled message is its first try
                attempt = (message.delivery_attempt if type(message) is ReceivedMessage
                           else message.reconsume_times + 1)
                self.plugins.hooks.message_delivered(self.name, group, message, client_id, attempt)

    def report_delivered(self, group: str, messages: list[StoredMessage], client_id: str = "") -> None:
        """Pop consumption handed ``messages`` to ``group`` again (redeliveries)."""
        self._emit_delivered(group, messages, client_id)

    def report_retried(self, group: str, message: StoredMessage, reconsume_times: int) -> None:
        """A consumer of ``group`` gave up on ``message`` for now; it comes back later."""
        self.plugins.hooks.message_retried(self.name, group, message, reconsume_times)

    def report_acked(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        """A consumer of ``group`` consumed ``messages`` successfully (a push listener's success)."""
        if self.plugins.hooks.observers.message_acked:
            for message in messages:
                self.plugins.hooks.message_acked(self.name, group, message, client_id)

    def report_pop_acked(self, group: str, commit_log_offset: int, size: int, client_id: str = "") -> None:
        """A pop consumer acked the message at ``commit_log_offset`` (read back only for an observer)."""
        if self.plugins.hooks.observers.message_acked:
            message = self.store.read(commit_log_offset, size)
            if message is not None:
                self.plugins.hooks.message_acked(self.name, group, message, client_id)

    def report_invisible_changed(self, group: str, commit_log_offset: int, size: int, client_id: str,
                                 invisible_ms: int, gave_up: bool) -> None:
        """A pop consumer changed a message's invisible time (read back only for an observer)."""
        if self.plugins.hooks.observers.message_invisible_changed:
            message = self.store.read(commit_log_offset, size)
            if message is not None:
                self.plugins.hooks.message_invisible_changed(self.name, group, message, client_id, invisible_ms,
                                                             gave_up)

    def report_redriven(self, group: str, message: StoredMessage, copy_msg_id: str, topic: str) -> None:
        """An operator sent ``group``'s dead letter ``message`` back; its copy ``copy_msg_id`` is on ``topic``."""
        self.plugins.hooks.message_redriven(self.name, group, message, copy_msg_id, topic)

    def append_system_records(self, topic: str, records: Sequence[tuple[bytes, Sequence[str]]]) -> int:
        """:class:`~plugmq.core.contracts.SystemTopicWriter`: an observer's records on system topic
        ``topic``, queue 0, in one store batch, without events. Open to observers until their
        ``plugmq_broker_stopping`` returned (the store closes after it)."""
        self.check_writable("store an observer's records")
        if not is_system_topic(topic):
            raise TopicError(f"topic {topic!r} is not a system topic; observers write only system topics")
        self.topics.ensure(topic, 1)  # also for no records: an observer makes its topic known when it starts
        if not records:
            return 0
        now = self.clock.now_ms()
        requests = []
        for body, keys in records:
            props = {Prop.UNIQ_KEY: new_unique_id()}
            if keys:
                props[Prop.KEYS] = " ".join(keys)
            requests.append(AppendRequest.trusted(topic, 0, body, props, born_timestamp_ms=now))
        self._append_batch(requests)
        return len(requests)

    def _append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        started = time.perf_counter()
        results = self.store.append_batch(requests)
        self.traffic.appended(time.perf_counter() - started)
        return results

    def cancel_delayed(self, msg_id: str) -> bool:
        """Cancel a not-yet-due delayed message by the msg_id its send returned."""
        self._check_open()
        if self.delay is None:
            raise DelayUnsupportedError(f"broker {self.name!r} has no delay plugin; nothing to cancel")
        if not self.delay.capabilities.cancel:
            plugin = self.plugins.with_family(Family.DELAY)[0]
            raise DelayUnsupportedError(
                f"delay plugin {plugin!r} cannot cancel delayed messages; use delay_wheel or delay_schedule"
            )
        cancelled = self.delay.cancel(msg_id)
        if cancelled and self.delay_ledger is not None:
            self.delay_ledger.cancelled(msg_id)  # no later master delivers it either
        return cancelled

    # ------------------------------------------------------------------------------ consuming
    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        """Compile a subscription with this broker's filter plugins."""
        compiler = self.filters.get(expression_type.upper())
        if compiler is None:
            raise FilterSyntaxError(
                f"no filter plugin for expression type {expression_type!r} in broker {self.name!r}; "
                f"available: {', '.join(sorted(self.filters)) or 'none (add filter_tag / filter_sql)'}",
                expression=expression,
            )
        return compiler.compile(expression)

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32,
             subscription: Filter | None = None, *, consumer_group: str = "", client_id: str = "") -> PullResult:
        """Read up to ``max_nums`` matching messages from ``offset`` of ``queue``.

        The subscription's pre-check runs on consume-queue entries first, so entries it rejects
        never cost a commit-log read; the exact check then runs on the message.
        """
        self._check_open()
        if max_nums < 1:
            raise ValidationError(f"max_nums must be >= 1, got {max_nums}")
        store = self.store
        low, high = store.min_offset(queue.topic, queue.queue_id), store.max_offset(queue.topic, queue.queue_id)
        if offset < low or offset > high:
            nxt = low if offset < low else high
            return PullResult(PullStatus.OFFSET_ILLEGAL, (), nxt, low, high)
        if offset == high:
            return PullResult(PullStatus.NO_NEW_MSG, (), offset, low, high)
        found: list[StoredMessage] = []
        budget = max_nums * (_PULL_SCAN_FACTOR if subscription is not None else 1)
        next_offset = offset
        while len(found) < max_nums and budget > 0 and next_offset < high:
            entries = store.read_queue(queue.topic, queue.queue_id, next_offset, min(budget, 256))
            if not entries:
                break
            for entry in entries:
                next_offset = entry.queue_offset + 1
                budget -= 1
                if subscription is not None and not subscription.precheck(entry):
                    continue
                message = store.read(entry.commit_log_offset, entry.size)
                if message is None or message.queue_offset != entry.queue_offset:
                    if self._repair_entry(queue, entry.queue_offset):
                        next_offset = entry.queue_offset  # rebuilt from the commit log: read it again
                        break
                    continue
                if subscription is not None and not subscription.matches(message.properties, message.tags):
                    continue
                found.append(message)
                if len(found) >= max_nums:
                    break
        self._emit_delivered(consumer_group, found, client_id)
        status = PullStatus.FOUND if found else PullStatus.NO_MATCHED_MSG
        return PullResult(status, tuple(found), next_offset, low, high)

    def _repair_entry(self, queue: MessageQueue, offset: int) -> bool:
        """A consume-queue entry led to no message: let the store rebuild damaged entries from
        its log (``repair_queue``, optional for a store); True when the entry should be read again.
        An entry that stays unreadable is skipped - the store logged and counted its loss."""
        if offset < self.store.min_offset(queue.topic, queue.queue_id):
            return False  # retention removed it meanwhile: nothing is damaged
        repair = getattr(self.store, "repair_queue", None)
        if repair is not None and repair(queue.topic, queue.queue_id, offset):
            return True
        log.warning("consume-queue entry unreadable; message skipped", topic=queue.topic, queue=queue.queue_id,
                    queue_offset=offset)
        return False

    # ------------------------------------------------------------------------------ clients
    def producer(self, group: str, **options: Any) -> Producer:
        """A producer for ``group`` (sync, async, one-way and batch sends)."""
        self._check_open()
        return Producer(self, group, **options)

    def push_consumer(self, group: str, listener: Callable[[list[StoredMessage]], Any], **options: Any) -> PushConsumer:
        """A push consumer of ``group``; call ``subscribe(...)`` then ``start()``."""
        self._check_open()
        return PushConsumer(self, group, listener, **options)

    def pull_consumer(self, group: str) -> PullConsumer:
        """A pull consumer of ``group``: the caller picks queues and offsets and commits them."""
        self._check_open()
        return PullConsumer(self, group)

    def simple_consumer(self, group: str, subscriptions: Mapping[str, str | FilterExpression] | None = None, *,
                        consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET, consume_timestamp_ms: int | None = None,
                        await_duration_s: float = 0.0, client_id: str | None = None) -> SimpleConsumer:
        """A simple (pop) consumer of ``group``: ``receive``, ``ack``, ``change_invisible_duration``.

        ``subscriptions`` maps topics to filter expressions: a TAG expression string, or a
        :class:`FilterExpression` (SQL92 with ``FilterExpression(text, "SQL92")``).
        """
        self._check_open()
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
        self._check_open()
        self.check_writable("send transactional messages")
        return TransactionProducer(self, group, local_transaction, check_listener)

    # ------------------------------------------------------------------------------ consumer groups
    def group_policy(self, group: str) -> GroupPolicy:
        """The group's policy from ``[groups]`` (redelivery, FIFO), or the configured defaults."""
        return self.config.groups.policy(group)

    def offsets(self, group: str, member: str | None = None) -> OffsetStore:
        """The broker-kept offsets of a clustering group (one atomically rewritten file), or with
        ``member``, those of one member of a broadcasting group (each member keeps its own)."""
        return self.consumer_offsets.view(group, member)

    def delete_group(self, group: str) -> None:
        """Forget everything the broker keeps for ``group``: its offsets and its pop consumers'
        progress and in-flight messages. Refused while push consumers of the group are running."""
        self._check_open()
        validate_group(group)
        members = self.groups.members(group)
        if members:
            raise ClientError(f"group {group!r} still has running consumers ({', '.join(members)}); "
                              "shut them down before deleting the group")
        self.consumer_offsets.forget_group(group)
        dropped = self.pop.delete_group(group)
        log.info("consumer group deleted", group=group, pop_lanes=dropped)

    def allocation_strategy(self, name: str, params: Mapping[str, Any] | None = None) -> AllocateStrategy:
        """A new instance of the allocation strategy ``name`` (from the broker's allocation plugins)."""
        factory = self.strategies.get(name)
        if factory is None:
            raise ClientError(f"allocation strategy {name!r} is not offered by broker {self.name!r}; "
                              f"available: {', '.join(sorted(self.strategies)) or 'none (add the alloc plugin)'}")
        return factory(**(params or {}))

    def join_group(self, member: GroupMember) -> None:
        """Add a clustering consumer to its group (rebalances the group)."""
        self.groups.register(member)

    def leave_group(self, member: GroupMember) -> None:
        self.groups.unregister(member)

    def heartbeat(self, group: str, client_id: str) -> bool:
        return self.groups.heartbeat(group, client_id)

    @property
    def delay_available(self) -> bool:
        """Whether a delay plugin is assembled (delayed sends, and retries through %RETRY%)."""
        return self.delay is not None

    def register_consumer(self, consumer: Stoppable) -> None:
        with self._lock:
            self._consumers.append(consumer)

    def unregister_consumer(self, consumer: Stoppable) -> None:
        with self._lock:
            if consumer in self._consumers:
                self._consumers.remove(consumer)

    def wake_consumers(self) -> None:
        """Tell waiting consumers that messages arrived or became visible again (long polling),
        and every arrival listener."""
        for listener in self.arrival_listeners:
            listener()
        if self._waiting:  # consumers wait only in wait_for_messages, which counts them
            with self._arrivals:
                self._arrivals.notify_all()

    def wait_for_messages(self, timeout: float) -> None:
        """Block until messages arrive or ``timeout`` real seconds passed."""
        with self._arrivals:
            self._waiting += 1
            try:
                self._arrivals.wait(timeout)
            finally:
                self._waiting -= 1

    def send_back(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """A consumer gave up on ``message`` for now: retry it later, or dead-letter it.

        ``policy`` (default: the group's) decides: the delivery that failed was attempt
        ``reconsume_times + 1``; if that was the last, the message goes to the dead-letter topic,
        else a copy goes to ``%RETRY%<group>`` after the policy's back-off for that attempt, with
        ``reconsume_times + 1``. With the default back-off these are RocketMQ's delay levels
        ``3 + reconsume_times`` (10 s, 30 s, 1 min, ... 2 h), which every delay plugin can express.
        """
        policy = policy if policy is not None else self.group_policy(group).redelivery
        failed_attempt = message.reconsume_times + 1
        if policy.exhausted(failed_attempt):
            return self.dead_letter(message, group, policy)
        topic = retry_topic(group)
        self.topics.ensure(topic, 1)
        delay_ms = policy.backoff_ms(failed_attempt)
        level = self._delay_level_of(delay_ms)
        copy = Message(topic, message.body, tags=message.tags, keys=message.keys,
                       properties=message.user_properties, delay_level=level,
                       deliver_at_ms=None if level is not None else self.clock.now_ms() + delay_ms)
        result = self.put(copy, 0, allow_system_topic=True, reconsume_times=failed_attempt,
                          extra_properties=self._lineage(message, failed_attempt))
        self.plugins.hooks.message_retried(self.name, group, message, failed_attempt)
        return result

    def _delay_level_of(self, delay_ms: int) -> int | None:
        """The delay level (1-based) lasting exactly ``delay_ms`` with this broker's delay plugin."""
        levels = (self.delay.capabilities.levels_ms if self.delay is not None else None) or DEFAULT_DELAY_LEVELS_MS
        try:
            return levels.index(delay_ms) + 1
        except ValueError:
            return None

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """Move ``message`` to the group's dead-letter topic (``%DLQ%<group>`` unless ``policy``
        names another); stored there as a normal message, never dropped."""
        policy = policy if policy is not None else self.group_policy(group).redelivery
        topic = policy.dead_letter_topic_for(group)
        self.topics.ensure(topic, 1)
        copy = Message(topic, message.body, tags=message.tags, keys=message.keys, properties=message.user_properties)
        result = self.put(copy, 0, allow_system_topic=True, reconsume_times=message.reconsume_times,
                          extra_properties=self._lineage(message, message.reconsume_times))
        log.warning("message dead-lettered", group=group, topic=message.topic, msg_id=message.msg_id,
                    reconsume_times=message.reconsume_times, dead_letter_topic=topic)
        self.plugins.hooks.message_dead_lettered(self.name, group, message)
        return result

    @staticmethod
    def _lineage(message: StoredMessage, reconsume_times: int) -> dict[str, str]:
        lineage = {
            Prop.RETRY_TOPIC: message.properties.get(Prop.RETRY_TOPIC, message.topic),
            Prop.ORIGIN_MESSAGE_ID: message.properties.get(Prop.ORIGIN_MESSAGE_ID, message.msg_id),
            Prop.RECONSUME_TIME: str(reconsume_times),
        }
        if message.unique_id:
            lineage[Prop.UNIQ_KEY] = message.unique_id
        trace_context = message.properties.get(Prop.TRACE_CONTEXT)
        if trace_context:
            lineage[Prop.TRACE_CONTEXT] = trace_context
        return lineage

    # ------------------------------------------------------------------------------ queries
    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        return self.store.query_by_id(msg_id)

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        validate_topic(topic)
        return self.store.query_by_key(topic, key, max_results=max_results, begin_ms=begin_ms, end_ms=end_ms)

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None) -> int:
        """Where a group with no position on ``queue`` starts: its first message, its end (only
        messages sent from now on), or the first message stored at or after ``timestamp_ms``."""
        if consume_from is ConsumeFrom.FIRST_OFFSET:
            return self.min_offset(queue)
        if consume_from is ConsumeFrom.TIMESTAMP:
            if timestamp_ms is None:
                raise ValidationError("consume_from=TIMESTAMP needs a timestamp (consume_timestamp_ms)")
            return self.offset_for_timestamp(queue, timestamp_ms)
        return self.max_offset(queue)

    def offset_for_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return self.store.offset_for_timestamp(queue.topic, queue.queue_id, timestamp_ms)

    def min_offset(self, queue: MessageQueue) -> int:
        return self.store.min_offset(queue.topic, queue.queue_id)

    def max_offset(self, queue: MessageQueue) -> int:
        return self.store.max_offset(queue.topic, queue.queue_id)

    # ------------------------------------------------------------------------------ retention
    def _start_retention(self) -> None:
        """Retention on the broker's clock for the store and services; never below what a
        consumer group has not consumed (its committed offsets) - see plugmq.core.retention."""
        self.retention_floor.hold("consumer groups",
                                  lambda: consumer_group_floor(self.consumer_offsets.tables(), self.name, self.store))
        self.retention_floor.hold("pop consumers", lambda: pop_consumer_floor(self.pop.state, self.store))
        self.retention.add("store", self.store)
        self.retention.add("state snapshots", self.journals)
        self.retention.start()

    # ------------------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise ClientError(f"broker {self.name!r} is closed")

    def _closing_step(self, failures: list[Exception]) -> Callable[[str, Callable[[], object]], None]:
        """Runs one step of closing: a failure is logged and kept, and closing goes on."""
        def step(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as exc:  # reported; the caller decides what to raise
                log.exception("a step of closing the broker failed; closing goes on", broker=self.name, step=what)
                failures.append(exc)
        return step

    def _close_services(self, step: Callable[[str, Callable[[], object]], None] | None = None) -> None:
        """Close every service, then the store. Without ``step`` (a failed start, whose own error
        is raised), a service that fails to close is logged and the rest still close."""
        run = step or self._closing_step([])
        replication: ReplicationService | None = getattr(self, "replication", None)
        if replication is not None:
            run("replication", replication.close)  # first: no slave waits on, or writes into, a closing store
        if hasattr(self, "retention"):
            run("retention", self.retention.close)
        cluster = getattr(self, "cluster", None)
        if cluster is not None:
            run("cluster", cluster.close)  # first: routes stop naming this broker before its services stop
        pop: PopService | None = getattr(self, "pop", None)
        if pop is not None:
            run("pop", pop.close)
        for what in ("transactions", "delay"):
            service = getattr(self, what, None)
            if service is not None:
                run(what, service.close)
        self.store.close()

    def close(self) -> None:
        """Stop background services, persist their state, flush and close the store. Idempotent.

        A step that fails (say, a full disk while the offsets are persisted) is logged and the
        rest still run, so the store is always closed; the first failure is raised at the end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        failures: list[Exception] = []
        step = self._closing_step(failures)
        step("broker_stopping hooks", lambda: self.plugins.hooks.broker_stopping(self.name))
        for consumer in list(self._consumers):
            step("a consumer's shutdown", consumer.shutdown)
        step("consumer offsets", self.consumer_offsets.persist_all)
        step("groups", self.groups.close)
        self._close_services(step)
        if failures:
            raise failures[0]
        log.info("broker closed", broker=self.name)

