"""Hook specifications: the architecture of plugmq, one family at a time.

A plugin is a module (or object) registered under its entry-point name in group
``plugmq.plugins``. It implements some of the hooks below with ``@plugmq.core.hookimpl``.
The broker registers only the plugins its config names; one assembly (``Broker(...)``,
``Broker.open``, ``Broker.from_config``) then runs, in this order and each step once:

1. ``plugmq_declare`` on every plugin (families, options, capabilities), then the cardinality
   checks (exactly one storage plugin; zero or one delay, transaction, cluster and replication
   plugin; filter expression types and allocation strategy names unique — this asks
   ``plugmq_filter_compilers`` and ``plugmq_allocate_strategies``, whose merged answers the broker
   then reuses);
2. each plugin's ``[plugins.<name>]`` table is validated against its declared options class;
3. ``plugmq_configure`` on every plugin;
4. the factories in dependency order: ``plugmq_make_store``, then ``plugmq_make_delay_scheduler``
   and ``plugmq_make_transaction_service`` (which get the store), then
   ``plugmq_make_replication_service`` (which gets the store and the broker's role);
5. ``plugmq_broker_started``. The other event hooks fire while the broker runs;
   ``plugmq_broker_stopping`` at its first ``close()``.

Tools outside a broker load plugins too and so call ``plugmq_declare`` (and only the hooks they
need): ``plugmq plugins`` and ``plugmq check-config``, ``plugmq.allocate`` /
``plugmq.compile_filter`` (the keyed offers of every installed plugin, once per process), and
``plugmq.broker.components`` (the conformance suite and benchmarks open one store or delay
scheduler without a broker, without ``plugmq_configure``).

Core code never calls these hooks directly: it goes through ``plugmq.core.pluginmanager.Hooks``,
a typed wrapper, so the arguments of every call are checked in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from plugmq.core.contracts import (
        AllocateStrategyFactory,
        ClusterContext,
        ClusterService,
        DelayContext,
        DelayScheduler,
        FilterCompiler,
        MessageStore,
        PluginContext,
        PluginDeclaration,
        ReplicationContext,
        ReplicationService,
        SystemTopicWriter,
        TransactionContext,
        TransactionService,
    )
    from plugmq.core.message import StoredMessage

PROJECT_NAME = "plugmq"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -------------------------------------------------------------------------------------------------
# declaration (every plugin)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_declare() -> PluginDeclaration:
    """Say who this plugin is: its name, families, options class and capabilities.

    Called once each time a plugin set is loaded (``plugmq.core.pluginmanager.load_plugins``),
    on every plugin of the set, before any other hook: once per broker assembly; tools that list
    or check plugins (``plugmq plugins``, ``check-config``, the conformance suite) load a plugin
    as often as they need, so keep it free of side effects. Every plugin must implement it; the
    declared ``name`` must equal the plugin's entry-point name.

    :return: a :class:`~plugmq.core.contracts.PluginDeclaration`. Not firstresult: the core
        collects one declaration per plugin.
    """


@hookspec
def plugmq_configure(context: PluginContext) -> None:
    """Receive the broker's context (options of every plugin, clock, data dir) before any factory.

    Called by the broker once per assembly on every registered plugin, after every plugin's
    options were validated and before ``plugmq_make_store``. Not called outside a broker
    (``plugmq.broker.components`` opens single components without it). Plugins without a factory
    (observers) read their options here with ``context.options_for(<name>)``.
    Not firstresult; return value ignored.

    :param context: broker name, data dir, clock and the validated options of every plugin.
    """


# -------------------------------------------------------------------------------------------------
# storage family (exactly one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_store(context: PluginContext) -> MessageStore | None:
    """Open (creating or recovering) the broker's message store.

    Called by the broker once per assembly, after ``plugmq_configure`` and before every other
    factory; also by ``plugmq.broker.components.open_store`` (conformance suite, benchmarks) once
    per store it opens, possibly many times on one directory. The core has already checked that
    exactly one registered plugin declares the storage family.

    :param context: broker name, data dir, clock, store host and every plugin's options; the
        store keeps its files under ``context.plugin_dir(<plugin name>)``.
    :return: the :class:`~plugmq.core.contracts.MessageStore`, recovered and ready for appends.
        firstresult: the first non-None value is used.
    """


# -------------------------------------------------------------------------------------------------
# delay family (zero or one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_delay_scheduler(context: DelayContext) -> DelayScheduler | None:
    """Build the delay strategy that holds delayed messages until they are due.

    Called by the broker once per assembly, after the store exists, when a plugin declaring the
    delay family is registered; also by ``plugmq.broker.components.open_delay_scheduler``. With no
    delay plugin registered the broker refuses delayed sends with an error naming the installed
    delay plugins.

    :param context: as for storage, plus ``store`` (the broker's MessageStore) and ``deliver``
        (writes a due message back to its real topic/queue as a normal message).
    :return: a :class:`~plugmq.core.contracts.DelayScheduler`, recovered; the broker calls its
        ``start()`` once the broker is fully assembled. firstresult.
    """


# -------------------------------------------------------------------------------------------------
# filter family (any number, keyed by expression type)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_filter_compilers() -> Mapping[str, FilterCompiler]:
    """Offer filter compilers, keyed by expression type ("TAG", "SQL92", ...).

    Called once per plugin set and cached: during broker assembly its cardinality check and the
    broker share one call (asked again only if a plugin is registered or unregistered later);
    ``plugmq.compile_filter`` and ``plugmq filter`` ask every installed plugin once per process.
    Two plugins offering the same expression type is an error naming both.

    :return: expression type -> :class:`~plugmq.core.contracts.FilterCompiler`. Not firstresult:
        the core merges the mappings of all plugins. Each compiler's ``capabilities.examples``
        (valid expressions with messages they must and must not match) are what the conformance
        suite runs its semantic clauses on.
    """


# -------------------------------------------------------------------------------------------------
# allocation family (any number, keyed by strategy name)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_allocate_strategies() -> Mapping[str, AllocateStrategyFactory]:
    """Offer queue-allocation strategies, keyed by strategy name ("AVG", "CONSISTENT_HASH", ...).

    Called once per plugin set and cached, like ``plugmq_filter_compilers``: once per broker
    assembly (rebalance uses the group's strategy); ``plugmq.allocate`` and ``plugmq allocate``
    ask every installed plugin once per process. Duplicate names are an error naming both plugins.

    :return: name -> factory; the factory takes the strategy's keyword parameters and returns an
        :class:`~plugmq.core.contracts.AllocateStrategy`. Not firstresult: mappings are merged.
        The plugin's declaration maps each name to its
        :class:`~plugmq.core.contracts.AllocationCapabilities` (``example_params`` build a working
        strategy for the conformance suite, whose broker clauses run on one of these strategies).
    """


# -------------------------------------------------------------------------------------------------
# transaction family (zero or one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_transaction_service(context: TransactionContext) -> TransactionService | None:
    """Build the half-message store and check-back service.

    Called by the broker once per assembly, after the store and delay scheduler exist, when a
    plugin declaring the transaction family is registered. With no transaction plugin the broker
    refuses transactional sends with a clear error. The service keeps half
    messages invisible to consumers, records every decision durably before it takes effect,
    applies it at most once (also across a crash between recording and delivering), checks
    undecided ones back on ``context.clock`` with the producer group's live checker (the
    schedule it declares in :class:`~plugmq.core.contracts.TransactionCapabilities`) and moves
    those never decided to ``TRANS_DISCARD_TOPIC`` with a warning.

    :param context: as for storage, plus ``store`` and ``deliver`` (makes a committed message
        visible on its real topic; a discarded one goes through it to the discard topic).
    :return: a :class:`~plugmq.core.contracts.TransactionService`; the broker calls ``start()``
        when assembly is done (recovery happens there). firstresult.
    """


# -------------------------------------------------------------------------------------------------
# cluster family (zero or one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_cluster_service(context: ClusterContext) -> ClusterService | None:
    """Open a session with the cluster's name service (ZooKeeper, ...), for a broker in a cluster.

    Called once by the broker while it is assembled, after the store, delay and transaction
    services, only when the config names a cluster (``[cluster] name``) and a cluster plugin;
    the core has checked that at most one registered plugin declares the cluster family. With
    none, the broker is a single machine: no name service, routes name only itself. The session
    is connected when this returns; nothing is registered yet (``plugmq serve`` registers the
    broker with its advertised endpoint once it listens). The broker closes the service first
    when it closes, so its registration disappears before the store shuts down.

    :param context: as for storage, plus ``cluster_name``.
    :return: a :class:`~plugmq.core.contracts.ClusterService`. firstresult. Raises ClusterError
        when the name service cannot be reached in time (the message names the hosts tried).
    """


# -------------------------------------------------------------------------------------------------
# replication family (zero or one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_replication_service(context: ReplicationContext) -> ReplicationService | None:
    """Build the broker's side of master / slave replication for its role.

    Called by the broker once per assembly, after the store, delay and transaction services
    exist and before they start, when a plugin declaring the replication family is registered
    (the core has checked there is at most one, and that the store declares the ``replication``
    capability). Without one the broker has no slaves, and the roles ``sync_master`` and
    ``slave`` are refused with a clear error. The broker calls the service's ``start()`` at the
    end of assembly, ``await_replicated`` after every send of a ``sync_master``, and ``close()``
    first when it closes. A slave broker refuses sends and runs no delay or transaction
    service: only the replication stream writes its store.

    :param context: as for storage, plus ``store`` (a ReplicableStore), the broker's ``role``
        and ``broker_id`` (``[broker] role`` / ``broker_id``), ``replicated`` (a slave calls
        it with the new end offset after each chunk it appended) and the hand-over of a slave's
        readers' progress (:class:`~plugmq.core.contracts.ConsumerHandover`).
    :return: a :class:`~plugmq.core.contracts.ReplicationService`. firstresult.
    """


# -------------------------------------------------------------------------------------------------
# events (any number of observers; return values are ignored)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_broker_started(broker_name: str, system_writer: SystemTopicWriter) -> None:
    """The broker finished assembly and started its services.

    Called by the broker once per broker, at the end of a successful assembly (``Broker(...)``,
    ``Broker.open``, ``Broker.from_config``), after the delay and transaction services started,
    in the thread that built the broker. Not called when assembly fails.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param system_writer: appends an observer's own records to a system topic of this broker (the
        trace plugin's ``RMQ_SYS_TRACE_TOPIC``) without firing events; usable until
        ``plugmq_broker_stopping`` returns. Added in a later version: observers that do not write
        leave it out of their signature.
    """


@hookspec
def plugmq_broker_stopping(broker_name: str) -> None:
    """The broker is about to stop its services and flush.

    Called by the broker once per broker, at its first ``close()`` (later calls do nothing),
    before push consumers shut down and offsets are persisted, while the store and services are
    still open, in the closing thread. Not called for a broker whose assembly failed.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    """


@hookspec
def plugmq_message_stored(broker_name: str, message: StoredMessage) -> None:
    """A message was stored on a topic consumers read (a send, a retry or DLQ copy, a write-back).

    Called by the broker once per message, right after the store returned, in the storing
    thread: every send (``put``; ``put_batch`` once per message of the batch), every retry or
    dead-letter copy, and every write-back of the delay and transaction services (a delayed
    message when it comes due, a committed transactional message, a discarded one on the discard
    topic). Not for what those services keep to themselves (half messages, the schedule topic).
    The broker builds the message (from the request and where the store put it, without reading
    it back) only when some plugin implements this hook; keep it cheap. Who only needs to know
    that messages arrived (to wake long polls, as ``plugmq serve``) appends a callable to
    ``Broker.arrival_listeners`` instead.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param message: the stored message, with its queue offset and message id.
    """


@hookspec
def plugmq_message_delivered(broker_name: str, consumer_group: str, message: StoredMessage,
                             client_id: str, attempt: int) -> None:
    """A message was handed to a consumer (pull result or push listener).

    Called by the broker once per message handed to a named consumer group, in the consuming
    thread, before the messages are handed over: every message ``Broker.pull`` returns with
    ``consumer_group=`` (push and pull consumers, a simple consumer's first delivery), and every
    redelivery of pop consumption (simple consumers, the gRPC server: a message whose invisible
    time ran out, handed out again). A pull without a group (admin reads) calls nothing. A retry copy consumed
    from the retry topic is delivered again. Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group the consumer belongs to.
    :param message: the delivered message.
    :param client_id: the consumer's client id ("" when the caller did not say: a pull consumer,
        a pop receive without one). Added in a later version: leave it out of an implementation
        that does not need it.
    :param attempt: which delivery of the message this is to the group (1 = the first; a pop
        redelivery counts up; a retry copy is its reconsume times + 1). Added in a later version.
    """


@hookspec
def plugmq_message_acked(broker_name: str, consumer_group: str, message: StoredMessage, client_id: str) -> None:
    """A consumer of the group is done with a message: it was consumed successfully.

    Called by the broker once per message, after the ack took effect, in the acking thread: pop
    consumption's ack (simple consumers, the gRPC server's AckMessage), and a push consumer whose
    listener returned success (each message of the batch). A pull consumer commits offsets, not
    messages, and calls nothing. The broker reads a pop message back for this call only when some
    plugin implements it. Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group that consumed the message.
    :param message: the message acknowledged.
    :param client_id: the consumer's client id ("" when unknown).
    """


@hookspec
def plugmq_message_invisible_changed(broker_name: str, consumer_group: str, message: StoredMessage,
                                     client_id: str, invisible_ms: int, gave_up: bool) -> None:
    """A pop consumer changed a message's invisible duration: a nack, or more time to process it.

    Called by the broker once per change, after it took effect, in the calling thread: pop
    consumption's ``change_invisible_duration`` (``SimpleConsumer.change_invisible_duration`` and
    ``nack``, the gRPC server's ChangeInvisibleDuration). When the consumer gave up and attempts are
    left, ``plugmq_message_retried`` follows. Read back only when some plugin implements it.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group of the consumer.
    :param message: the message whose invisible time changed.
    :param client_id: the consumer's client id ("" when unknown).
    :param invisible_ms: how long the message now stays invisible (the back-off when it gave up).
    :param gave_up: the consumer failed on the message (a nack) rather than asking for more time.
    """


@hookspec
def plugmq_message_retried(
    broker_name: str, consumer_group: str, message: StoredMessage, reconsume_times: int
) -> None:
    """A consumer asked to reconsume a message later; it goes to the group's retry topic.

    Called by the broker once per message a consumer gives up on while the group's redelivery
    policy has attempts left, in the consuming thread: ``Broker.send_back`` (a concurrent push
    consumer sends back each message of a batch whose listener returned RECONSUME_LATER or
    raised), after the retry copy was accepted for ``%RETRY%<group>``; and pop consumption
    (simple consumers, the gRPC server) when the consumer asks for the message again later
    (``change_invisible_duration`` after a failure, e.g. a push client's nack). A pop message
    whose invisible time simply ran out is redelivered without this event; orderly push
    consumers retry in place and do not call it. Without attempts left the message is
    dead-lettered instead (``plugmq_message_dead_lettered``). Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group whose listener failed.
    :param message: the message as it was consumed.
    :param reconsume_times: the delivery attempt that failed (1 for the first delivery), i.e.
        how many times it will have been reconsumed after this retry.
    """


@hookspec
def plugmq_message_dead_lettered(broker_name: str, consumer_group: str, message: StoredMessage) -> None:
    """A message exhausted its retries and was moved to the group's dead-letter topic.

    Called by the broker (``Broker.dead_letter``) once per message, after the dead-letter copy
    was stored on ``%DLQ%<group>`` (or the topic the group's redelivery policy names), in the
    thread that gave up: ``send_back`` of a message whose last attempt failed, an orderly push
    consumer after its last attempt, pop consumption (simple consumers, the gRPC server) after
    the last delivery attempt or when the consumer forwards the message to the DLQ.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group that gave up on the message.
    :param message: the message as it was last consumed.
    """


@hookspec
def plugmq_message_redriven(broker_name: str, consumer_group: str, message: StoredMessage, copy_msg_id: str,
                            topic: str) -> None:
    """A dead letter of the group was sent back to be consumed again (a re-drive).

    Called by the broker's admin operations (``resend-dlq``: ``plugmq admin``, the console) once per
    dead letter, after the copy was stored on ``topic`` (its original topic, or the group's retry
    topic), in the admin's thread. The copy's own ``plugmq_message_stored`` came first.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group whose dead letter it was.
    :param message: the dead letter, as stored on the dead-letter topic.
    :param copy_msg_id: the offset message id of the copy sent back.
    :param topic: where the copy went.
    """
