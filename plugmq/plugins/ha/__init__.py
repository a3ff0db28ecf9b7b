"""ha: master / slave replication of the commit log over TCP (RocketMQ's HA model).

Roles come from the broker config: ``[broker] role = "async_master" | "sync_master" | "slave"``
and ``broker_id`` (0 for the master, 1.. for its slaves, all under the same broker name). A slave
reports the offset its store holds; the master streams its commit log from there; the slave's
store appends the records at the same offsets and rebuilds its consume queues and indexes. A
``sync_master`` acks a send once a slave confirmed it (seed 004's 同步双写). Options:
:class:`HaOptions` (``[plugins.ha]``)::

    [broker]
    name = "broker-a"
    role = "sync_master"
    plugins = ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "alloc", "txn", "ha"]

    [plugins.ha]
    listen = "10.0.0.5:10912"               # where slaves connect (default: loopback, a free port)
    secret_file = "/etc/plugmq/cluster.secret"  # master and slaves prove it to each other
    tls_cert = "/etc/plugmq/broker-a-0.pem"     # TLS: this broker's certificate and key,
    tls_key = "/etc/plugmq/broker-a-0.key"
    tls_ca = "/etc/plugmq/cluster-ca.pem"       # and the cluster's CA (plugmq.plugins.ha.tls)

and on the slave ``role = "slave"``, ``broker_id = 1``, ``[plugins.ha] master = "10.0.0.5:10912"`` and
the same ``secret_file``. Without a secret anyone who reaches the port can pull the log, ack for a
slave or pose as the master (:mod:`plugmq.plugins.ha.auth`); without TLS message bodies cross the
network in clear: keep it on loopback then.
"""

from __future__ import annotations

from plugmq.core import (
    Family,
    PluginDeclaration,
    ReplicationContext,
    ReplicationService,
    hookimpl,
)
from plugmq.plugins.ha.options import HaOptions
from plugmq.plugins.ha.service import CAPABILITIES, HaService

__all__ = ["HaOptions", "HaService", "plugmq_declare", "plugmq_make_replication_service"]

NAME = "ha"


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.REPLICATION},
        description="master/slave replication: commit-log shipping over TCP, async or sync double-write",
        options=HaOptions,
        capabilities=CAPABILITIES,
    )


@hookimpl
def plugmq_make_replication_service(context: ReplicationContext) -> ReplicationService | None:
    options = context.options_for(NAME)
    return HaService(context, options if options is not None else HaOptions(), context.plugin_dir(NAME))
