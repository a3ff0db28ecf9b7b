"""The broker's side of replication: which role it plays, and opening the replication plugin.

A broker's role (``[broker] role``) is ``async_master`` (the default: acks at once, slaves
optional), ``sync_master`` (a send is acked once a slave holds it) or ``slave`` (read-only: only
the replication stream writes its store; consumers may read). ``sync_master`` and ``slave`` need
a replication plugin (e.g. ``ha``) in ``broker.plugins``, and that plugin needs a store that can
ship its log (the ``replication`` capability).

With ``[broker] failover = true`` the cluster's election picks the master (``plugmq.broker.failover``):
the broker starts as a slave, the replication plugin (one with the ``failover`` capability)
switches sides at run time, and ``role`` names the mode the broker works in while it is master.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from plugmq.broker.topics import TopicTable
from plugmq.core.contracts import (
    BrokerRole,
    ConsumerHandover,
    Family,
    MessageStore,
    ReplicableStore,
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationService,
)
from plugmq.core.errors import PluginError, ReadOnlyBrokerError
from plugmq.core.logs import get_logger
from plugmq.core.pluginmanager import LoadedPlugins, installed_of_family

__all__ = ["TopicFollower", "open_replication", "read_only_error"]

log = get_logger(__name__)


def open_replication(loaded: LoadedPlugins, base: Mapping[str, Any], store: MessageStore, *, role: BrokerRole,
                     broker_id: int, replicated: Callable[[int], None], truncated: Callable[[int], None],
                     failover: bool, where: str, handover: Callable[[], ConsumerHandover] | None = None,
                     handed_over: Callable[[ConsumerHandover], None] | None = None,
                     adopt: Callable[[ConsumerHandover, int], int] | None = None) -> ReplicationService | None:
    """The replication plugin's service for this broker, or None for a master without one.
    ``handover`` / ``handed_over`` / ``adopt``: see :class:`ReplicationContext`."""
    plugins = loaded.with_family(Family.REPLICATION)
    if not plugins:
        if role is BrokerRole.ASYNC_MASTER and not failover:
            return None
        installed = installed_of_family(Family.REPLICATION)
        need = "broker.failover = true" if failover else f"broker.role = {role.value!r}"
        raise PluginError(f"{where}: {need} needs a replication plugin in broker.plugins; "
                          f"add one of: {', '.join(installed) or 'ha'}")
    plugin = plugins[0]
    declared = loaded.declarations[plugin].capabilities
    if failover and not (isinstance(declared, ReplicationCapabilities) and declared.failover):
        raise PluginError(f"{where}: broker.failover = true needs a replication plugin that switches roles "
                          f"(capabilities.failover); {plugin!r} does not; use ha")
    if not (store.capabilities.replication and isinstance(store, ReplicableStore)):
        storage = loaded.with_family(Family.STORAGE)
        raise PluginError(f"{where}: replication plugin {plugin!r} needs a store that ships its commit log, but "
                          f"{', '.join(storage)} does not declare the replication capability; use store_mmap, "
                          "store_lmdb or store_rocks")
    service = loaded.hooks.make_replication_service(ReplicationContext(
        **base, store=store, role=role, broker_id=broker_id, replicated=replicated, truncated=truncated,
        failover=failover, handover=handover, handed_over=handed_over, adopt=adopt))
    if service is None:
        raise PluginError(f"replication plugin {plugin!r} returned no replication service")
    return service


def read_only_error(broker_name: str, action: str) -> ReadOnlyBrokerError:
    return ReadOnlyBrokerError(f"broker {broker_name!r} is a slave (read-only): it cannot {action}; send to its "
                               "master (broker id 0), whose log this slave copies")


class TopicFollower:
    """On a slave: follows the master's topic deletions and re-creations (their journal), and
    adds the topics and queues the replicated log brings to the broker's topic table (the
    store's queue map is in memory, so asking after every chunk is cheap); a deleted topic's
    queues stay in the store but not in the table."""

    def __init__(self, store: MessageStore, table: TopicTable) -> None:
        self._store = store
        self._table = table

    def refresh(self) -> None:
        table, deleted = self._table, self._table.deleted
        try:
            if deleted is not None:
                table.apply_followed(deleted.follow())
            for topic, count in self._store.queues().items():
                if (table.get(topic) or 0) < count and not (deleted is not None and deleted.deleted(topic)):
                    table.ensure(topic, count)
        except Exception:  # a bad topic must not stop replication; it is logged
            log.exception("learning replicated topics failed")

    def reload(self) -> None:
        """The log was cut: deletions recorded in the cut part are undone, then as :meth:`refresh`."""
        if self._table.deleted is not None:
            self._table.apply_followed(self._table.deleted.reload())
        self.refresh()
