"""A cluster seen from outside any broker: what ``plugmq admin`` needs.

::

    service = open_cluster_service("broker-a.toml")      # the cluster that config names
    try:
        view = service.view()                            # live brokers, rooms, roles, endpoints, epochs, topics
        print(view.as_dict())
        service.declare_topic("Orders", ClusterTopic(8)) # every master creates it (update-topic --cluster)
    finally:
        service.close()

Only the config's cluster plugin is loaded: the broker's store is not opened, so this works
beside a running ``plugmq serve`` of the same config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugmq.config.broker import load_config
from plugmq.core.clock import SystemClock
from plugmq.core.contracts import ClusterContext, ClusterService, Family
from plugmq.core.errors import ConfigError, PluginError
from plugmq.core.pluginmanager import build_options, installed_of_family, load_plugins

__all__ = ["open_cluster_service"]


def open_cluster_service(source: str | os.PathLike[str] | Mapping[str, Any]) -> ClusterService:
    """A name-service session for the cluster a broker config names (close it when done).

    Raises ConfigError when the config names no cluster, PluginError when it lists no cluster
    plugin, ClusterError when the name service cannot be reached.
    """
    config = load_config(source)
    if config.cluster_name is None:
        raise ConfigError(f'{config.source}: names no cluster; a cluster config has [cluster] name = "..."')
    loaded = load_plugins(config.plugins, config_path=f"{config.source}: broker.plugins", check_cardinality=False)
    plugins = loaded.with_family(Family.CLUSTER)
    if not plugins:
        raise PluginError(f"{config.source}: broker.plugins lists no cluster plugin; add one of: "
                          f"{', '.join(installed_of_family(Family.CLUSTER)) or 'cluster_zk'}")
    name = plugins[0]
    options = build_options(loaded.declarations[name], config.plugin_options.get(name),
                            config_path=f"{config.source}: plugins.{name}")
    context = ClusterContext(broker_name=config.name, data_dir=Path(config.data_dir), clock=SystemClock(),
                             store_host=config.store_host, options={name: options}, cluster_name=config.cluster_name)
    service = loaded.hooks.make_cluster_service(context)
    if service is None:
        raise PluginError(f"cluster plugin {name!r} returned no cluster service")
    return service
