"""Assembly: a broker's parts built from its config and plugins, in dependency order.

Each part is built once every part it calls exists, and nothing starts before every part is
built, so no callback (of a plugin, a journal, the replication stream) reaches a half-built one:

1. the plugins and their options, the data dir, the store;
2. the role (journals ask it whether they may write), topics, consumer groups, the journals and
   consumer offsets;
3. the delay ledger (with replication), the write-back, the delay and transaction services;
4. sending, reads, redelivery, pop consumption;
5. the replication service, whose callbacks reach the state a slave follows (offsets, pop), and
   the role switch of failover;
6. retention; then starting: the services on a master, pop, replication; last the cluster session.

A failure closes what was built (plugmq.broker.lifecycle) and raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.broker.dedup import DedupWindows
from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.deletedtopics import DeletedTopics
from plugmq.broker.events import Arrivals, Events
from plugmq.broker.groups import GroupRegistry
from plugmq.broker.journal import Journal, JournalSet
from plugmq.broker.lifecycle import Lifecycle
from plugmq.broker.offsets import ConsumerOffsets
from plugmq.broker.pop import PopService
from plugmq.broker.popstate import PopState, adopt_legacy_state
from plugmq.broker.ratelimit import RateLimiter
from plugmq.broker.reads import Reads
from plugmq.broker.redelivery import Redelivery
from plugmq.broker.replication import TopicFollower, open_replication
from plugmq.broker.replies import Replies
from plugmq.broker.retention import RetentionSchedule, consumer_group_floor, pop_consumer_floor
from plugmq.broker.roles import FollowedState, Roles, RoleSwitch
from plugmq.broker.sending import Sender
from plugmq.broker.services import Services
from plugmq.broker.topics import TopicQueues, TopicTable
from plugmq.broker.traffic import Traffic
from plugmq.broker.writeback import DeliveredCopies, WriteBack
from plugmq.config.broker import BrokerConfig
from plugmq.config.datadir import prepare_data_dir
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.clock import Clock
from plugmq.core.contracts import (
    AllocateStrategyFactory,
    ClusterContext,
    ClusterService,
    DelayContext,
    Family,
    Filter,
    FilterCompiler,
    MessageStore,
    PluginContext,
    ReplicationService,
    TransactionContext,
)
from plugmq.core.errors import PluginError
from plugmq.core.message import ConsumeQueueEntry, MessageQueue, PullResult, SendResult, StoredMessage
from plugmq.core.modes import ConsumeFrom
from plugmq.core.pluginmanager import LoadedPlugins, build_options, installed_of_family, load_plugins
from plugmq.core.retention import RetentionFloor

__all__ = ["Parts", "assemble"]


@attrs.frozen
class Parts:
    """Everything a broker is made of, built and started."""

    config: BrokerConfig
    clock: Clock
    plugins: LoadedPlugins
    store: MessageStore
    filters: dict[str, FilterCompiler]
    strategies: dict[str, AllocateStrategyFactory]
    retention_floor: RetentionFloor
    retention: RetentionSchedule
    traffic: Traffic
    arrivals: Arrivals
    events: Events
    lifecycle: Lifecycle
    roles: Roles
    topics: TopicQueues
    groups: GroupRegistry
    journals: JournalSet
    consumer_offsets: ConsumerOffsets
    delay_ledger: DelayLedger | None
    services: Services
    writeback: WriteBack
    sender: Sender
    reads: Reads
    redelivery: Redelivery
    pop: PopService
    replication: ReplicationService | None
    switch: RoleSwitch
    cluster: ClusterService | None
    dedup: DedupWindows
    limits: RateLimiter
    replies: Replies


@attrs.frozen
class _Base:
    """What every stage builds on: the config, the plugins and what their contexts share."""

    config: BrokerConfig
    clock: Clock
    plugins: LoadedPlugins
    context: Mapping[str, Any]  # the PluginContext fields every context has
    store: MessageStore
    floor: RetentionFloor
    retention: RetentionSchedule
    lifecycle: Lifecycle

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def broker_dir(self) -> Path:
        """Where the broker keeps its own state (topics, consumer offsets)."""
        path = Path(self.config.data_dir) / "broker"
        path.mkdir(parents=True, exist_ok=True)
        return path


@attrs.define
class _PopBackend:
    """Pop consumption's view of the broker (plugmq.broker.pop.PopBackend), over its parts."""

    clock: Clock
    topics: TopicQueues
    reads: Reads
    redelivery: Redelivery
    events: Events
    roles: Roles

    def topic_queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]:
        return self.topics.queues(topic, create=create)

    def check_serving(self) -> None:
        self.roles.check_serving()

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, subscription: Filter | None = None, *,
             consumer_group: str = "", client_id: str = "") -> PullResult:
        return self.reads.pull(queue, offset, max_nums, subscription, consumer_group=consumer_group,
                               client_id=client_id, limited=False)  # pop receive takes from the limits itself

    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        return self.reads.read_message(commit_log_offset, size)

    def read_messages(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        return self.reads.read_messages(entries)

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None) -> int:
        return self.reads.start_offset(queue, consume_from, timestamp_ms)

    def group_policy(self, group: str) -> GroupPolicy:
        return self.redelivery.group_policy(group)

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        return self.redelivery.dead_letter(message, group, policy)

    def report_delivered(self, group: str, messages: list[StoredMessage], client_id: str = "") -> None:
        self.events.delivered(group, messages, client_id)

    def report_pop_acked(self, group: str, commit_log_offset: int, size: int, client_id: str = "") -> None:
        self.events.pop_acked(group, commit_log_offset, size, client_id)

    def report_invisible_changed(self, group: str, commit_log_offset: int, size: int, client_id: str,
                                 invisible_ms: int, gave_up: bool) -> None:
        self.events.invisible_changed(group, commit_log_offset, size, client_id, invisible_ms, gave_up)

    def report_retried(self, group: str, message: StoredMessage, reconsume_times: int) -> None:
        self.events.retried(group, message, reconsume_times)


def assemble(config: BrokerConfig, clock: Clock, plugin_objects: Mapping[str, object] | None = None) -> Parts:
    """Build a broker's parts from ``config`` and start them; on failure close what was built."""
    plugins = load_plugins(config.plugins, config_path=f"{config.source}: broker.plugins", objects=plugin_objects)
    options = {
        name: build_options(decl, config.plugin_options.get(name), config_path=f"{config.source}: plugins.{name}")
        for name, decl in plugins.declarations.items()
    }
    data_dir = Path(config.data_dir)
    prepare_data_dir(data_dir, config.source)
    floor = RetentionFloor()
    retention = RetentionSchedule(clock)
    context: dict[str, Any] = {"broker_name": config.name, "data_dir": data_dir, "clock": clock,
                               "store_host": config.store_host, "max_message_size": config.max_message_size,
                               "options": options, "retention": floor}
    plugin_context = PluginContext(**context)
    plugins.hooks.configure(plugin_context)
    store = plugins.hooks.make_store(plugin_context)
    if store is None:
        raise PluginError(f"storage plugin {plugins.with_family(Family.STORAGE)} returned no store")
    lifecycle = Lifecycle(config.name, store)
    lifecycle.on_close("retention", retention.close)
    try:
        return _assemble(_Base(config, clock, plugins, context, store, floor, retention, lifecycle))
    except BaseException:
        lifecycle.abort()
        raise


def _assemble(base: _Base) -> Parts:
    config, clock, store, lifecycle, plugins = base.config, base.clock, base.store, base.lifecycle, base.plugins
    filters, strategies = plugins.hooks.filter_compilers(), plugins.hooks.allocate_strategies()
    traffic = Traffic()  # messages in/out and append latency, for metrics
    arrivals = Arrivals()
    events = Events(base.name, plugins, store, traffic)
    roles = Roles(base.name, config, store)
    seen_in_store = dict(store.queues())  # before the journals prepare their (empty) queues
    # Service state rides in the commit log (plugmq.broker.journal): one order, one cut.
    journals = JournalSet(store, writable=roles.writable, settle=roles.settle_state, broker_name=base.name,
                          floor=base.floor, clock=clock)
    deleted = DeletedTopics(journals.open("topics"))
    journals.compact_with("topics", deleted.compact)
    table = TopicTable(base.broker_dir / "topics.json", seen_in_store, deleted)
    topics = TopicQueues(table, base.name, default_queue_count=config.default_queue_count,
                         auto_create=config.auto_create_topic)
    groups = GroupRegistry(clock, config.heartbeat_timeout_s, topics.queues)
    offsets = ConsumerOffsets(journals.open("offsets"), legacy_root=base.broker_dir)
    journals.compact_with("offsets", offsets.compact)
    lifecycle.on_close("consumer offsets", offsets.persist_all)
    lifecycle.on_close("groups", groups.close)
    lifecycle.on_close("broker_stopping hooks", events.stopping)
    copies = DeliveredCopies(store)
    txn_journal = journals.open("txn") if plugins.with_family(Family.TRANSACTION) else None
    ledger = _delay_ledger(base, roles, journals, copies)
    writeback = WriteBack(base.name, clock, store, table, roles, events, arrivals, traffic, ledger, copies)
    services = _services(base, writeback, copies, txn_journal)
    limits = RateLimiter(clock, config.limits)
    replies = Replies()
    dedup = DedupWindows(config.topic_settings, clock, store,
                         journals.open("dedup") if config.topic_settings.any_dedup else None, table.all, deleted.floor)
    table.subscribe(lambda topic, count: dedup.forget_topic(topic) if count == 0 else None)
    if dedup.journal is not None:
        journals.compact_with("dedup", dedup.compact)
    if roles.writable():
        dedup.load()
    sender = Sender(max_message_size=config.max_message_size, clock=clock, store=store, topics=topics, roles=roles,
                    services=services, ledger=ledger, events=events, arrivals=arrivals, traffic=traffic,
                    lifecycle=lifecycle, topic_settings=config.topic_settings, dedup=dedup, limits=limits,
                    replies=replies)
    reads = Reads(base.name, store, filters, events, lifecycle.check_open, limits, roles.commit.visible_end,
                  deleted.floor)
    redelivery = Redelivery(config.groups, table, sender, services, clock, events)
    pop = _pop(base, journals, _PopBackend(clock, topics, reads, redelivery, events, roles), table, arrivals, limits)
    followed = FollowedState(base.name, roles, TopicFollower(store, table), offsets, pop, arrivals)
    replication = open_replication(plugins, base.context, store, role=roles.role, broker_id=config.broker_id,
                                   replicated=followed.replicated, truncated=followed.truncated,
                                   failover=config.failover, where=config.source, handover=followed.handover,
                                   handed_over=followed.handed_over, adopt=followed.adopt)
    roles.attach(replication)
    if replication is not None:
        lifecycle.on_close("replication", replication.close)
    switch = RoleSwitch(base.name, roles, followed, offsets, pop, services, ledger, dedup, lifecycle.check_open)
    _start(base, roles, offsets, pop, journals, services, replication)
    cluster = _join_name_service(base)
    if cluster is not None:
        lifecycle.on_close("cluster", cluster.close)
    return Parts(config, clock, plugins, store, filters, strategies, base.floor, base.retention, traffic, arrivals,
                 events, lifecycle, roles, topics, groups, journals, offsets, ledger, services, writeback, sender, reads,
                 redelivery, pop, replication, switch, cluster, dedup, limits, replies)


def _delay_ledger(base: _Base, roles: Roles, journals: JournalSet, copies: DeliveredCopies) -> DelayLedger | None:
    """With replication, delayed messages are intents in the log too, so a promoted slave
    delivers what its master had pending (plugmq.broker.delayledger); None without."""
    plugins = base.plugins
    if not plugins.with_family(Family.DELAY) or not plugins.with_family(Family.REPLICATION):
        return None
    ledger = DelayLedger(journals.open("delay"), copies.was_delivered)
    journals.compact_with("delay", ledger.compact)
    base.floor.hold("delay intents", ledger.floor)
    if roles.writable():
        ledger.load()
    return ledger


def _services(base: _Base, writeback: WriteBack, copies: DeliveredCopies, txn_journal: Journal | None) -> Services:
    """The delay and transaction services, built over the write-back (a master starts them)."""
    delay_context = txn_context = None
    if base.plugins.with_family(Family.DELAY):
        delay_context = DelayContext(**base.context, store=base.store, deliver=writeback.deliver_delayed,
                                     was_delivered=copies.was_delivered, deliver_batch=writeback.deliver_batch)
    if txn_journal is not None:
        txn_context = TransactionContext(**base.context, store=base.store, deliver=writeback.deliver,
                                         journal=txn_journal)
    services = Services(base.name, base.plugins, base.retention, delay_context=delay_context, txn_context=txn_context)
    base.lifecycle.on_close("transactions", services.close_transactions)
    base.lifecycle.on_close("delay", services.close_delay)
    services.build()  # after the closing steps: a failure here closes what it built already
    return services


def _pop(base: _Base, journals: JournalSet, backend: _PopBackend, topics: TopicTable, arrivals: Arrivals,
         limits: RateLimiter) -> PopService:
    """Pop consumption over its durable state (imported once from older data dirs)."""
    config = base.config
    adopt_legacy_state(base.broker_dir / "pop", Path(config.data_dir) / "server")
    state = PopState(journals.open("pop"), fsync=config.pop_fsync, compact_bytes=config.pop_compact_bytes,
                     legacy_dir=base.broker_dir / "pop")
    journals.compact_with("pop", state.compact)
    pop = PopService(backend, state, limits, base.config.topic_settings)
    pop.collect(topics.all())
    pop.deadline_listeners.append(arrivals.wake)
    base.lifecycle.on_close("pop", pop.close)
    return pop


def _start(base: _Base, roles: Roles, offsets: ConsumerOffsets, pop: PopService, journals: JournalSet,
           services: Services, replication: ReplicationService | None) -> None:
    """Start what runs in the background, every part being built."""
    # Retention on the broker's clock for the store and services; never below what a consumer
    # group has not consumed (its committed offsets) - see plugmq.core.retention.
    store, floor, retention = base.store, base.floor, base.retention
    floor.hold("consumer groups", lambda: consumer_group_floor(offsets.tables(), base.name, store))
    floor.hold("pop consumers", lambda: pop_consumer_floor(pop.state, store))
    retention.add("store", store)
    retention.add("state snapshots", journals)
    retention.start()
    # A slave's store is written by the replication stream alone: no delay or transaction
    # service of its own may deliver into it; they start when it is promoted.
    if roles.writable():
        services.start()
    pop.start()
    if replication is not None:
        replication.start()


def _join_name_service(base: _Base) -> ClusterService | None:
    """The cluster plugin's session when the config names a cluster; None for a single broker."""
    plugins = base.plugins.with_family(Family.CLUSTER)
    cluster_name = base.config.cluster_name
    if not plugins and cluster_name is None:
        return None
    where = base.config.source
    if not plugins:
        installed = installed_of_family(Family.CLUSTER)
        raise PluginError(f"{where}: [cluster] name = {cluster_name!r} needs a cluster plugin in broker.plugins; "
                          f"add one of: {', '.join(installed) or 'cluster_zk'}")
    if cluster_name is None:
        raise PluginError(f"{where}: plugin {plugins[0]!r} joins a cluster but the config names none; add "
                          f'[cluster] with name = "<cluster>", or remove {plugins[0]!r} for a single broker')
    service = base.plugins.hooks.make_cluster_service(ClusterContext(**base.context, cluster_name=cluster_name))
    if service is None:
        raise PluginError(f"cluster plugin {plugins[0]!r} returned no cluster service")
    return service
