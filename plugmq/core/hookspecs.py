"""Hook specifications: the architecture of plugmq, one family at a time.

A plugin is a module (or object) registered under its entry-point name in group
``plugmq.plugins``. It implements some of the hooks below with ``@plugmq.core.hookimpl``.
The broker registers only the plugins its config names, then:

1. calls ``plugmq_declare`` on each to learn its families, options and capabilities, and checks
   cardinality (exactly one storage plugin; zero or one delay and transaction plugin; filter
   expression types and allocation strategy names unique);
2. validates each plugin's ``[plugins.<name>]`` table against its declared options class;
3. calls the factory hooks in dependency order: storage, then delay and transaction (which get
   the store), collecting filters and allocation strategies;
4. emits the event hooks while it runs.

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
        DelayContext,
        DelayScheduler,
        FilterCompiler,
        MessageStore,
        PluginContext,
        PluginDeclaration,
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

    Called by the broker (and ``plugmq plugins``) once per assembly, before any factory, on every
    registered plugin. Every plugin must implement it; the declared ``name`` must equal the
    plugin's entry-point name.

    :return: a :class:`~plugmq.core.contracts.PluginDeclaration`. Not firstresult: the core
        collects one declaration per plugin.
    """


@hookspec
def plugmq_configure(context: PluginContext) -> None:
    """Receive the broker's context (options of every plugin, clock, data dir) before any factory.

    Called once by the broker on every registered plugin right after options were validated.
    Plugins without a factory (observers) read their options here with
    ``context.options_for(<name>)``. Not firstresult; return value ignored.

    :param context: broker name, data dir, clock and the validated options of every plugin.
    """


# -------------------------------------------------------------------------------------------------
# storage family (exactly one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_store(context: PluginContext) -> MessageStore | None:
    """Open (creating or recovering) the broker's message store.

    Called once by the broker while it is assembled, before every other factory. The core has
    already checked that exactly one registered plugin declares the storage family.

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

    Called once by the broker after the store exists. With no delay plugin registered the broker
    refuses delayed sends with an error naming the installed delay plugins.

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

    Called once by the broker while it is assembled, and by ``plugmq.compile_filter`` over every
    installed plugin. Two plugins offering the same expression type is an error naming both.

    :return: expression type -> :class:`~plugmq.core.contracts.FilterCompiler`. Not firstresult:
        the core merges the mappings of all plugins.
    """


# -------------------------------------------------------------------------------------------------
# allocation family (any number, keyed by strategy name)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_allocate_strategies() -> Mapping[str, AllocateStrategyFactory]:
    """Offer queue-allocation strategies, keyed by strategy name ("AVG", "CONSISTENT_HASH", ...).

    Called once by the broker while it is assembled (rebalance uses the group's strategy), and
    by ``plugmq.allocate`` over every installed plugin. Duplicate names are an error naming both
    plugins.

    :return: name -> factory; the factory takes the strategy's keyword parameters and returns an
        :class:`~plugmq.core.contracts.AllocateStrategy`. Not firstresult: mappings are merged.
    """


# -------------------------------------------------------------------------------------------------
# transaction family (zero or one per broker)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def plugmq_make_transaction_service(context: TransactionContext) -> TransactionService | None:
    """Build the half-message store and check-back service.

    Called once by the broker after the store (and delay scheduler) exist. With no transaction
    plugin the broker refuses transactional sends with a clear error. The service keeps half
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
# events (any number of observers; return values are ignored)
# -------------------------------------------------------------------------------------------------


@hookspec
def plugmq_broker_started(broker_name: str) -> None:
    """The broker finished assembly and started its services.

    Called once by the broker at the end of its assembly (``Broker.open`` / ``from_config``).
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    """


@hookspec
def plugmq_broker_stopping(broker_name: str) -> None:
    """The broker is about to stop its services and flush.

    Called once by the broker at the start of ``close``, while the store is still open.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    """


@hookspec
def plugmq_message_stored(broker_name: str, message: StoredMessage) -> None:
    """A message was stored on a consumer-visible topic (a send, a delayed or committed write-back).

    Called by the broker after the store returned, in the storing thread; keep it cheap.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param message: the stored message, with its queue offset and message id.
    """


@hookspec
def plugmq_message_delivered(broker_name: str, consumer_group: str, message: StoredMessage) -> None:
    """A message was handed to a consumer (pull result or push listener).

    Called by the broker for each message a pull returns to a named consumer group.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group the consumer belongs to.
    :param message: the delivered message.
    """


@hookspec
def plugmq_message_retried(
    broker_name: str, consumer_group: str, message: StoredMessage, reconsume_times: int
) -> None:
    """A consumer asked to reconsume a message later; it goes to the group's retry topic.

    Called by the broker's consumer code when a listener returns RECONSUME_LATER (or raises),
    after the retry copy was accepted. Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group whose listener failed.
    :param message: the message as it was consumed.
    :param reconsume_times: how many times it will have been reconsumed after this retry.
    """


@hookspec
def plugmq_message_dead_lettered(broker_name: str, consumer_group: str, message: StoredMessage) -> None:
    """A message exhausted its retries and was moved to ``%DLQ%<group>``.

    Called by the broker's consumer code after the dead-letter copy was stored.
    Not firstresult; return value ignored.

    :param broker_name: the broker's configured name.
    :param consumer_group: the group that gave up on the message.
    :param message: the message as it was last consumed.
    """
